"""Adapters: I/O around the core, one third-party library per subpackage, imported lazily."""
