#!/usr/bin/env python3
"""The NVIDIA driver's machine code of a schedule's kernels, cut out of its pipeline cache file.

Usage: python3 bench/sass.py FILE.vkf.pipelines OUT_DIR [KERNELS_TXT]

NVIDIA's Vulkan driver offers statistics of a pipeline (`vkfuse kernels`) but no internal
representations, so what a source change did to a kernel's code cannot be asked of it. Its
pipeline cache holds the code, though: each entry is a zstd frame (its compressed size, which
counts the 4-byte size word before the frame, 12 bytes before the frame's magic; its size 4
bytes before) whose contents begin "NVDANVVMNVuc", the code's size at byte 0x4c and its offset
less 8 at byte 0x50. That was read off an H200's driver (docs/perf.md, session 55); nothing of
it is documented, so every step checks what it reads and says where it stops. Each entry's code
is written to OUT_DIR/NN-SIZE.bin and, where `nvdisasm` is on PATH (CUDA's, or Triton's in
torch's environment), disassembled for sm_90 into NN-SIZE.sass. KERNELS_TXT, the output of
`vkfuse kernels FILE.vkf`, names each entry by its "Binary Size" (several names where kernels
share a size). Needs zstd (the command or python's zstandard), which the device machine lacks:
run it where `bash bench/h100 sass` brings the cache file back.
"""
import os
import re
import shutil
import struct
import subprocess
import sys

MAGIC = b"\x28\xb5\x2f\xfd"
NVUC = b"NVDANVVMNVuc"


class BadFrame(Exception):
    pass


def decompress(frame: bytes, size: int) -> bytes:
    """The frame's contents (`size` bytes, as the entry says), or BadFrame."""
    try:
        import zstandard
    except ImportError:
        zstandard = None
    if zstandard is not None:
        try:
            return zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
        except zstandard.ZstdError as e:
            raise BadFrame(str(e))
    if not shutil.which("zstd"):
        sys.exit("sass.py: neither python's zstandard nor the zstd command is here")
    run = subprocess.run(["zstd", "-d", "-c"], input=frame, capture_output=True)
    if run.returncode != 0:
        raise BadFrame(run.stderr.decode(errors="replace").strip())
    return run.stdout


def kernel_names(path):
    """Binary size -> kernel labels, from `vkfuse kernels` output."""
    names = {}
    try:
        lines = open(path, encoding="utf-8", errors="replace").readlines()
    except OSError as e:
        sys.exit(f"sass.py: cannot read the kernels' table {path}: {e.strerror}")
    for line in lines:
        m = re.match(r"\s*(\d+)\s+\d+\s+\S+\s+(.*?)\s+Register Count (\d+).*Binary Size (\d+)",
                     line)
        if m:
            names.setdefault(int(m[4]), []).append(f"#{m[1]} {m[2]} ({m[3]} registers)")
    return names


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    cache, out = sys.argv[1], sys.argv[2]
    names = kernel_names(sys.argv[3]) if len(sys.argv) == 4 else {}
    try:
        data = open(cache, "rb").read()
    except OSError as e:
        sys.exit(f"sass.py: cannot read the pipeline cache {cache}: {e.strerror}")
    os.makedirs(out, exist_ok=True)
    nvdisasm = shutil.which("nvdisasm")
    found = 0
    for m in re.finditer(re.escape(MAGIC), data):
        at = m.start()
        if at < 12:
            continue
        # The compressed size counts the size word before the frame.
        csize, = struct.unpack_from("<Q", data, at - 12)
        usize, = struct.unpack_from("<I", data, at - 4)
        if not 4 < csize <= len(data) - at + 4:
            continue
        try:
            entry = decompress(data[at:at + csize - 4], usize)
        except BadFrame as e:
            print(f"{cache}: the zstd frame at byte {at} does not decompress ({e}); skipped")
            continue
        if len(entry) != usize:
            print(f"{cache}: the zstd frame at byte {at} gave {len(entry)} bytes, "
                  f"not {usize}; skipped")
            continue
        if not entry.startswith(NVUC) or len(entry) < 0x54:
            print(f"{cache}: the entry at byte {at} is not NVuc ({entry[:12]!r}); skipped")
            continue
        size, off = struct.unpack_from("<II", entry, 0x4C)
        start = off + 8
        code = entry[start:start + size]
        # Code ends in NOP padding (sm_90's NOP is 0x...7918); anything else means the layout
        # is not the one read off above.
        if len(code) != size or size % 16 or code[-16:-8] != bytes.fromhex("1879000000000000"):
            print(f"{cache}: the entry at byte {at} has no code where expected "
                  f"(size {size}, offset {start}); skipped")
            continue
        stem = os.path.join(out, f"{found:02}-{size}")
        open(stem + ".bin", "wb").write(code)
        label = "; ".join(names.get(size, ["(kernel unknown)"]))
        line = f"{stem}.bin: {size} bytes of code, {label}"
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "--binary", "SM90", "-hex", stem + ".bin"],
                                  capture_output=True, text=True)
            open(stem + ".sass", "w").write(f"// {label}\n" + sass.stdout + sass.stderr)
            n = sass.stdout.count("\n")
            loads = len(re.findall(r"\bLDG\b", sass.stdout))
            line += f"; {n} lines of SASS, {loads} global loads"
        print(line)
        found += 1
    print(f"{cache}: {len(data)} bytes, {found} kernels' code"
          + ("" if nvdisasm else " (no nvdisasm here: raw code only)"))


main()
