"""Generated gRPC stubs of the etcd v3 API subset the store sends (see README.md)."""
