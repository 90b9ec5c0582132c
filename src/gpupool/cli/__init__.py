"""Composition root for the ``gpupool`` command. Subcommands live one per module and import their
adapters lazily, so ``gpupool --help`` works on a bare install."""
