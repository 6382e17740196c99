"""Generate ``cels_pb2.py`` and ``cels_pb2_grpc.py`` from the proto file (``make proto``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO / "protos"
PROTO = PROTO_ROOT / "cels" / "protocol" / "wire" / "cels.proto"
GENERATED = ("cels_pb2.py", "cels_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on the proto file; return the generated files."""
    from grpc_tools import protoc

    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"--python_out={out_root}", f"--grpc_python_out={out_root}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    return [out_root / "cels" / "protocol" / "wire" / name for name in GENERATED]


def generated_in_tempdir() -> dict[str, bytes]:
    """The generated files' contents, produced in a scratch directory (for the drift test)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {path.name: path.read_bytes() for path in generate(Path(tmp))}


def main() -> int:
    for path in generate(REPO):
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
