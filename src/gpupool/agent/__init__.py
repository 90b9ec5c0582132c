"""The node agent (composition root of layer 3's node half): a control loop on an injected clock that
reads a device source, feeds the core watermark machine, pauses/resumes P2 work through pausers,
reports to the gateway (with an outbox while it is unreachable) and serves DCGM-style metrics."""
