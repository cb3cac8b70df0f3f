"""The prompt cache on disk as the commands use it: a second `run` over the same long document,
a restarted server and a chat resumed later start from what an earlier process cached and
answer as a cold run does; `macspec cache` shows it, `cache clear` frees it; 0 GB writes
nothing; --disk-cache-dir moves it."""

from __future__ import annotations

import io
import json

import anthropic
import pytest
import servekit
import tiny

from macspec.chat.session import ChatSession, open_models
from macspec.chat.store import Store
from macspec.cli import main
from macspec.engine.core.events import Done
from macspec.engine.core.stats import summary_line
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.home import macspec_home
from macspec.models.pairs import open_pair
from macspec.prefix.settings import DiskCacheSettings
from macspec.prefix.tier import attach_pair
from macspec.serve.backend import Backend, Defaults

DOCUMENT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(12))
"""About 650 ids with the tiny byte-level tokenizer: two whole blocks of 256."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return servekit.save_pair(tmp_path_factory.mktemp("pair"))


def run(capsys, monkeypatch, folders, *flags: str) -> tuple[int, dict, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(DOCUMENT))
    args = ["run", "-", "--raw", "--json", "--max-tokens", "8", "-k", "3"]
    args += ["--model", str(folders[0]), "--draft-model", str(folders[1]), *flags]
    code = main(args)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def drained() -> None:
    """What a process does as it ends: write what the prompt cache holds and has queued."""
    from macspec.prefix import tier

    tier._at_exit()


def test_a_second_run_over_the_same_document_starts_from_the_disk(capsys, monkeypatch, folders):
    code, cold, err = run(capsys, monkeypatch, folders)
    assert code == 0, err
    drained()
    stats = cold["stats"]
    prompt = len(cold["prompt_tokens"])
    assert prompt > 512 and stats["disk_tokens"] == 0 and stats["disk_written_bytes"] > 0
    code, warm, err = run(capsys, monkeypatch, folders)
    assert code == 0, err
    assert warm["tokens"] == cold["tokens"]
    cached = (prompt - 1) // 256 * 256
    assert warm["stats"]["disk_tokens"] == warm["stats"]["cached_tokens"] == cached
    assert warm["stats"]["prefilled_tokens"] == prompt - cached
    assert warm["stats"]["disk_written_bytes"] == 0  # a prefix cached already writes nothing

    # What is cached, per model; then freed, one model or all.
    assert main(["cache", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    names = sorted(m["name"] for m in shown["models"])
    assert names == sorted(map(str, folders))
    assert all(m["files"]["rows"] == cached // 256 and m["bytes"] > 0 for m in shown["models"])
    assert main(["cache", "clear", "--model", str(folders[1])]) == 0
    assert "freed" in capsys.readouterr().out
    main(["cache", "--json"])
    assert [m["name"] for m in json.loads(capsys.readouterr().out)["models"]] == [str(folders[0])]
    assert main(["cache", "clear", "--model", "nothing-like-it"]) == 2
    assert "no model named 'nothing-like-it'" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    capsys.readouterr()
    assert main(["cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"] == []


def test_a_model_with_nothing_cached_gets_no_row(capsys):
    """A run whose prompts were all shorter than a block registers its model and caches
    nothing: `macspec cache` shows no empty row for it (`--json` still lists the folder)."""
    from macspec.prefix.store import DiskStore

    root = DiskCacheSettings().root
    DiskStore(root, 0).register("f" * 64, {"name": "short-prompts-only"})
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "the prompt cache is empty" in out and "short-prompts-only" not in out
    assert main(["cache", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["models"]
    assert [(m["name"], m["files"], m["bytes"]) for m in listed] == [("short-prompts-only", {}, 0)]


def test_zero_gigabytes_writes_nothing_and_the_folder_can_move(
    capsys, monkeypatch, folders, tmp_path
):
    code, record, err = run(capsys, monkeypatch, folders, "--disk-cache-gb", "0")
    assert code == 0, err
    assert not (macspec_home() / "prompt-cache").exists()
    elsewhere = tmp_path / "elsewhere"
    code, record, err = run(capsys, monkeypatch, folders, "--disk-cache-dir", str(elsewhere))
    assert code == 0, err
    drained()
    assert list(elsewhere.rglob("*.rows.safetensors"))
    assert not (macspec_home() / "prompt-cache").exists()
    assert main(["run", "x", "--disk-cache-gb", "-1"]) == 2
    assert "--disk-cache-gb must be >= 0" in capsys.readouterr().err


@pytest.fixture(scope="module")
def hybrid_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    target = tiny.arch_model("qwen3_5", 0, scale=3.0)
    draft = tiny.noisy_arch_copy(target, 0.02, seed=1)
    return tiny.save_arch_model(target, root / "target"), tiny.save_arch_model(
        draft, root / "draft"
    )


def backend(folders, max_batch: int) -> Backend:
    """What `macspec serve --max-batch N` serves, on the prompt cache in the macspec home."""
    resolved = resolve_models(None, str(folders[0]), str(folders[1]))
    opened = open_pair(resolved, "3", batch=max_batch > 1)
    attach_pair(opened.engine, resolved, DiskCacheSettings())
    defaults = Defaults(max_tokens=8)
    return Backend(
        opened.engine, opened.tokenizer, "tiny", 2048, defaults, k=3, max_batch=max_batch
    )


@pytest.mark.parametrize("kind, max_batch", [("llama", 1), ("llama", 4), ("qwen3_5", 4)])
def test_a_restarted_server_starts_from_the_disk(folders, hybrid_folders, kind, max_batch):
    pair = folders if kind == "llama" else hybrid_folders
    messages = [{"role": "user", "content": "hello"}]
    replies = []
    for protocol in ("openai", "openai", "anthropic"):  # a server, restarted twice
        with servekit.ServerThread(backend(pair, max_batch), api_key=servekit.KEY) as server:
            if protocol == "openai":
                replies.append(
                    servekit.client(server).chat.completions.create(
                        model="tiny",
                        messages=[{"role": "system", "content": DOCUMENT}, *messages],
                        max_tokens=8,
                    )
                )
            else:
                api = anthropic.Anthropic(
                    base_url=server.base_url[:-3], api_key=servekit.KEY, max_retries=0
                )
                replies.append(
                    api.messages.create(
                        model="tiny", system=DOCUMENT, messages=messages, max_tokens=8
                    )
                )
        drained()
    cold, warm, claude = replies
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert claude.content[0].text == cold.choices[0].message.content
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    prompt = cold.usage.prompt_tokens
    cached = (prompt - 1) // 256 * 256
    assert warm.usage.prompt_tokens_details.cached_tokens == cached > 0
    # Anthropic's usage: ids loaded from disk are cache reads; the three add up to the prompt.
    usage = claude.usage
    assert usage.cache_read_input_tokens == cached
    assert (
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        == prompt
    )


def test_a_chat_resumed_later_starts_from_the_disk(folders):
    store, config = Store(), GenerationConfig(max_tokens=8)
    resolved = resolve_models(None, str(folders[0]), str(folders[1]))

    def session(conversation_id=None, gb=10.0):
        models = open_models(resolved, "3", disk_cache=DiskCacheSettings(gb=gb))
        return ChatSession(models.engine, models.tokenizer, store, conversation_id, config)

    first = session()
    done = [e for e in first.send(DOCUMENT) if isinstance(e, Done)][0]
    assert done.stats.disk_tokens == 0
    drained()
    # The next day: a new process, the conversation resumed.
    later = session(first.conversation_id)
    done = [e for e in later.send("and then?") if isinstance(e, Done)][0]
    assert done.stats.disk_tokens == (len(first.last_prompt) - 1) // 256 * 256
    assert "from disk" in summary_line(done.stats, done.finish_reason)
    cold = session(gb=0).engine.generate(later.last_prompt, config)
    assert done.tokens == [e for e in cold if isinstance(e, Done)][0].tokens


@pytest.mark.parametrize("kind, max_batch", [("llama", 1), ("llama", 4), ("qwen3_5", 4)])
def test_anthropic_usage_counts_the_blocks_a_request_wrote(
    folders, hybrid_folders, kind, max_batch
):
    pair = folders if kind == "llama" else hybrid_folders
    ask = {"model": "tiny", "system": DOCUMENT, "max_tokens": 8}
    ask["messages"] = [{"role": "user", "content": "hello"}]

    def usages(server) -> tuple[int, object, object]:
        api = anthropic.Anthropic(base_url=server.base_url[:-3], api_key=servekit.KEY)
        whole = api.messages.create(**ask).usage
        with api.messages.stream(**ask) as stream:
            streamed = stream.get_final_message().usage
        counted = api.messages.count_tokens(model="tiny", system=DOCUMENT, messages=ask["messages"])
        return counted.input_tokens, whole, streamed

    def total(usage) -> int:
        return (
            usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        )

    with servekit.ServerThread(backend(pair, max_batch), api_key=servekit.KEY) as server:
        prompt, cold, again = usages(server)
    drained()
    with servekit.ServerThread(backend(pair, max_batch), api_key=servekit.KEY) as server:
        _, restarted, _ = usages(server)
    blocks = (prompt - 1) // 256 * 256  # the whole blocks before the prompt's last id
    # Cold: the blocks are written (creation), the rest prefilled; nothing read.
    assert (cold.cache_read_input_tokens, cold.cache_creation_input_tokens) == (0, blocks)
    assert cold.input_tokens == prompt - blocks
    # Again, from memory; after a restart, from the disk: read, nothing written.
    assert again.cache_read_input_tokens > 0 and again.cache_creation_input_tokens == 0
    assert restarted.cache_read_input_tokens == blocks
    assert restarted.cache_creation_input_tokens == 0
    for usage in (cold, again, restarted):
        assert total(usage) == prompt  # what count_tokens says
