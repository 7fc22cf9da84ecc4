"""A hostile testee for the runner's tests: it serves through the reference testee (started as its own
child) and misbehaves once, on the Nth decode request, in one of these ways:

strided   answers a tensor of shape [64] with strides [2**28] over 4 bytes of data
negative  answers a tensor of shape [4] with strides [-1]
past      answers a uint8 tensor of shape [64] with strides [1] over 1 byte of data
objects   answers a 22 MB frame of 5.5 million empty tensors
flood     answers every decode with 32 MiB of ownerless data (N is ignored)
exit      exits with status 3 instead of answering
segv      kills itself with SIGSEGV instead of answering
hang      never answers, after starting a child of its own that ignores its input
text      writes a line of text on stdout instead of answering

usage: python tests/hostile_testee.py MODE N MARK
MARK is a file created when it misbehaves (so a restarted testee behaves); for ``hang`` it holds the pid
of the child that must not outlive the testee.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conformance import protocol as P  # noqa: E402
from conformance.wire import field, field_varint  # noqa: E402

TAMPERED = ("strided", "negative", "past", "objects", "flood")


def _tampered(mode: str, response) -> bytes:
    """The serialized answer that replaces ``response``."""
    if mode == "objects":
        empty_tensor_item = field(1, field(1, b""))  # Sequence.items: Value{tensor: {}}
        return field_varint(1, response.id) + field(4, field(1, field(3, empty_tensor_item * 5_500_000)))
    answer = P.Response(id=response.id)
    tensor = answer.value.value.tensor
    if mode == "strided":
        tensor.dtype, tensor.data = "float32", b"\0" * 4
        tensor.shape.append(64)
        tensor.strides.append(2**28)
    elif mode == "negative":
        tensor.dtype, tensor.data = "float32", b"\0" * 16
        tensor.shape.append(4)
        tensor.strides.append(-1)
    elif mode == "past":
        tensor.dtype, tensor.data = "uint8", b"\1"
        tensor.shape.append(64)
        tensor.strides.append(1)
    elif mode == "flood":
        tensor.dtype, tensor.data, tensor.ownerless = "uint8", bytes(32 << 20), True
        tensor.shape.append(32 << 20)
    return answer.SerializeToString()


def main() -> int:
    mode, at, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    sys.stdout = sys.stderr
    real = subprocess.Popen([sys.executable, "-m", "conformance.testee"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0)
    tamper: set[int] = set()
    out_lock = threading.Lock()

    def forward_requests() -> None:
        decodes = 0
        while True:
            try:
                request = P.read_frame(requests, P.Request)
            except P.FramingError:
                break
            if request.WhichOneof("op") == "decode":
                decodes += 1
                if mode == "flood" or (decodes == at and not os.path.exists(mark)):
                    if _misbehave(mode, mark, out, out_lock):
                        continue
                    tamper.add(request.id)
            P.write_frame(real.stdin, request)
        real.stdin.close()

    threading.Thread(target=forward_requests, daemon=True).start()
    while True:
        try:
            response = P.read_frame(real.stdout, P.Response)
        except P.FramingError:
            return 0
        data = _tampered(mode, response) if response.id in tamper else response.SerializeToString()
        with out_lock:
            out.write(struct.pack("<I", len(data)) + data)


def _misbehave(mode: str, mark: str, out, out_lock) -> bool:
    """Act on the chosen request; True when it must not reach the real testee."""
    with open(mark, "w") as note:
        if mode == "hang":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                     stdin=subprocess.DEVNULL)
            note.write(str(child.pid))
    if mode == "exit":
        os._exit(3)
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "text":
        with out_lock:
            out.write(b"hello from the testee\n")
    return mode in ("hang", "text")


if __name__ == "__main__":
    sys.exit(main())
