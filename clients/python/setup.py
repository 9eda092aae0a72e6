"""Builds shoal-client: generates the gRPC stubs from the repository's
`proto/` into the wheel (`shoal_client/_proto`), so that the stubs always
match the server they were built with and nothing generated is committed.

The protos are found at `../../proto/proto` (a build from a checkout, as
`pip install ./clients/python` does) or at `./proto` (a source tree that
carries a copy).
"""

import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def proto_root() -> Path:
    for candidate in (HERE / "proto", HERE.parent.parent / "proto" / "proto"):
        if (candidate / "shoal" / "v1" / "shoal.proto").is_file():
            return candidate
    raise SystemExit(
        "shoal-client: the protos (shoal/v1/*.proto) are neither in ./proto nor in ../../proto/proto; "
        "build from a shoal checkout: pip install ./clients/python"
    )


def runtime_requirements() -> list:
    # Generated code refuses a protobuf runtime, and its service stubs a
    # grpcio, older than the generator that made them.
    from importlib.metadata import version

    major, minor = (int(p) for p in version("protobuf").split(".")[:2])
    grpc_major, grpc_minor = (int(p) for p in version("grpcio-tools").split(".")[:2])
    return [f"grpcio>={grpc_major}.{grpc_minor}", f"protobuf>={major}.{minor},<{major + 1}", "numpy>=1.21"]


class BuildWithStubs(build_py):
    """build_py, then the stubs generated straight into the build tree."""

    def run(self) -> None:
        super().run()
        from grpc_tools import protoc
        import grpc_tools

        root = proto_root()
        out = Path(self.build_lib) / "shoal_client" / "_proto"
        out.mkdir(parents=True, exist_ok=True)
        protos = sorted(str(p.relative_to(root)) for p in (root / "shoal" / "v1").glob("*.proto"))
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"shoal-client: protoc failed on {protos} under {root}")
        # protoc writes absolute imports of the proto package (`from shoal.v1
        # import common_pb2`); inside this package they are relative to it.
        for f in out.rglob("*.py*"):
            text = f.read_text()
            fixed = re.sub(r"^from shoal\.v1 import", "from shoal_client._proto.shoal.v1 import", text, flags=re.M)
            fixed = re.sub(r"^import shoal\.v1\.(\w+) as", r"import shoal_client._proto.shoal.v1.\1 as", fixed, flags=re.M)
            if fixed != text:
                f.write_text(fixed)
        for d in (out, out / "shoal", out / "shoal" / "v1"):
            (d / "__init__.py").touch()


setup(
    cmdclass={"build_py": BuildWithStubs},
    install_requires=runtime_requirements(),
)
