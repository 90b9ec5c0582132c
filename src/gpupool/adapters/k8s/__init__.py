"""Kubernetes adapter: scheduler extender (HTTP), kubelet device plugin (gRPC), pod reconciler.

Modules and what each depends on (third-party imports are lazy, inside functions):
- `resources`: extended resource names and pod -> `PodDemand` parsing (standard library only);
- `annotations`: versioned placement / node-slice annotation codecs (standard library only);
- `inventory`: slices from a parsed cluster spec or from node annotations (standard library only);
- `pool`: `ExtenderPool`, kube-scheduler's questions translated onto the one `LeaseController` (its
  `CardIndex` and pod-UID binds are the core's; no I/O);
- `owner`: who runs those calls on the single-threaded controller (a lock, or the gateway's loop);
- `extender`: the HTTP server for kube-scheduler's extender protocol (``http.server``);
- `kubeapi`: the few Kubernetes API calls we make (the ``kubernetes`` client);
- `pending`, `device_plugin`: kubelet device-plugin v1beta1 over gRPC (``grpcio`` + ``protobuf``);
- `reconciler`: pod watch -> release / adopt / drift (the ``kubernetes`` client).

The library group of this adapter is the ``k8s`` extra: kubernetes, grpcio, protobuf.
"""
