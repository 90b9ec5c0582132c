"""A fake kubelet for device-plugin tests: the Registration service on ``<dir>/kubelet.sock`` and
the PodResources lister on its own socket, both real gRPC servers over unix sockets."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2_grpc as pbg
from gpupool.adapters.k8s.proto import podresources_v1_pb2 as pr
from gpupool.adapters.k8s.proto import podresources_v1_pb2_grpc as prg


class FakeKubelet:
    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.registered: list[Any] = []
        self.cond = threading.Condition()
        self.server: Any = None

    def Register(self, request: Any, context: Any) -> Any:
        with self.cond:
            self.registered.append(request)
            self.cond.notify_all()
        return pb.Empty()

    def start(self) -> FakeKubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        server.start()
        self.server = server
        return self

    def stop(self, *, wipe: bool = True) -> None:
        self.server.stop(grace=None)
        if wipe:  # kubelet's device manager removes every socket in the directory when it starts
            for f in self.dir.iterdir():
                f.unlink()

    def wait_registered(self, n: int, timeout_s: float = 10.0) -> Any:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.registered) >= n, timeout=timeout_s)
        assert ok, f"plugin registered {len(self.registered)} times, wanted {n}"
        return self.registered[n - 1]

    def plugin(self, endpoint: str) -> tuple[Any, Any]:
        channel = grpc.insecure_channel(f"unix://{self.dir / endpoint}")
        return channel, pbg.DevicePluginStub(channel)


class FakePodResources:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[tuple[str, str, str, list[str]]] = []  # namespace, pod, resource, device ids
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prg.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{socket}")
        self.server = server

    def List(self, request: Any, context: Any) -> Any:
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=name,
                    namespace=ns,
                    containers=[
                        pr.ContainerResources(
                            name="main", devices=[pr.ContainerDevices(resource_name=res, device_ids=ids)]
                        )
                    ],
                )
                for ns, name, res, ids in self.pods
            ]
        )
