"""A gRPC client of a DRA kubelet plugin built on gRPC's C core (grpcio), with stubs generated
by grpcio-tools from the plugin crate's own proto files: what a Python tool, sidecar or test of a
DRA driver would use.

    client.py <proto dir> <work dir>

generates the stubs into <work dir>, then reads calls from stdin, one JSON object a line:

    {"socket": "/path/dra.sock", "call": "dra.v1.NodePrepareResources", "request": "<base64>"}

(`request` is the encoded request message), makes each through the generated stub on a channel to
"unix:<socket>" (one channel per socket, kept for the run) and prints one JSON line per call:

    {"code": "OK", "details": "", "response": "<base64 of the encoded response>"}

For the health streams (`health.v1.NodeWatchResources`, `health.v1alpha1.NodeWatchResources`)
the response is the stream's first message.
"""

import base64
import importlib
import json
import os
import shutil
import sys

# The proto files, copied to importable package names: (package, source path, file name).
PROTOS = [
    ("pluginregistration", "pluginregistration/registration.proto", "registration"),
    ("dra_v1", "dra/v1/dra.proto", "dra"),
    ("dra_v1beta1", "dra/v1beta1/dra.proto", "dra"),
    ("health_v1", "dra-health/v1/health.proto", "health"),
    ("health_v1alpha1", "dra-health/v1alpha1/health.proto", "health"),
]

# call name -> (package, service, method, request type, server streaming)
CALLS = {
    "registration.GetInfo": ("pluginregistration", "Registration", "GetInfo", "InfoRequest", False),
    "registration.NotifyRegistrationStatus": (
        "pluginregistration", "Registration", "NotifyRegistrationStatus", "RegistrationStatus", False),
    "dra.v1.NodePrepareResources": (
        "dra_v1", "DRAPlugin", "NodePrepareResources", "NodePrepareResourcesRequest", False),
    "dra.v1.NodeUnprepareResources": (
        "dra_v1", "DRAPlugin", "NodeUnprepareResources", "NodeUnprepareResourcesRequest", False),
    "dra.v1beta1.NodePrepareResources": (
        "dra_v1beta1", "DRAPlugin", "NodePrepareResources", "NodePrepareResourcesRequest", False),
    "dra.v1beta1.NodeUnprepareResources": (
        "dra_v1beta1", "DRAPlugin", "NodeUnprepareResources", "NodeUnprepareResourcesRequest", False),
    "health.v1.NodeWatchResources": (
        "health_v1", "DRAResourceHealth", "NodeWatchResources", "NodeWatchResourcesRequest", True),
    "health.v1alpha1.NodeWatchResources": (
        "health_v1alpha1", "DRAResourceHealth", "NodeWatchResources", "NodeWatchResourcesRequest", True),
}


def generate(proto_dir, work_dir):
    """Generates the stubs of every proto into work_dir and puts it on sys.path."""
    from grpc_tools import protoc

    src = os.path.join(work_dir, "protos")
    out = os.path.join(work_dir, "generated")
    for package, path, name in PROTOS:
        os.makedirs(os.path.join(src, package), exist_ok=True)
        os.makedirs(os.path.join(out, package), exist_ok=True)
        shutil.copyfile(os.path.join(proto_dir, path), os.path.join(src, package, name + ".proto"))
        args = ["protoc", "-I" + src, "--python_out=" + out, "--grpc_python_out=" + out,
                os.path.join(package, name + ".proto")]
        if protoc.main(args) != 0:
            sys.exit("protoc failed for " + path)
    sys.path.insert(0, out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: client.py <proto dir> <work dir>")
    generate(sys.argv[1], sys.argv[2])

    import grpc

    modules = {}
    for package, _, name in PROTOS:
        modules[package] = (importlib.import_module(package + "." + name + "_pb2"),
                            importlib.import_module(package + "." + name + "_pb2_grpc"))

    channels = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        call = json.loads(line)
        package, service, method, request_type, streaming = CALLS[call["call"]]
        pb2, pb2_grpc = modules[package]
        socket = call["socket"]
        if socket not in channels:
            channels[socket] = grpc.insecure_channel(
                "unix:" + socket, options=[("grpc.max_receive_message_length", 64 << 20)])
        stub = getattr(pb2_grpc, service + "Stub")(channels[socket])
        request = getattr(pb2, request_type).FromString(base64.b64decode(call["request"]))
        result = {"code": "OK", "details": "", "response": None}
        try:
            if streaming:
                stream = getattr(stub, method)(request, timeout=30)
                response = next(stream)
                stream.cancel()
            else:
                response = getattr(stub, method)(request, timeout=30)
            result["response"] = base64.b64encode(response.SerializeToString()).decode()
        except grpc.RpcError as e:
            result["code"] = e.code().name
            result["details"] = e.details() or ""
        print(json.dumps(result), flush=True)
    for channel in channels.values():
        channel.close()


if __name__ == "__main__":
    main()
