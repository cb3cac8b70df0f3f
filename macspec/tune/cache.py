"""The target's answers, kept between `macspec tune` runs (SQLite in the macspec home).

Generating the answers is most of a tune run; trying another learning rate or step count
should not pay for it again. Each answer is kept as soon as it is generated, under a key of
what decides it: the target (its folder, config and weight files' names, sizes and times),
MLX's version, the prompt's ids, the longest answer, the temperature and the seed. The
target's top-k log-probabilities are kept beside it, keyed by k as well. An interrupted run
keeps the answers it finished; a cache that cannot be opened or written is skipped with a
note, never an error (it only saves time).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import mlx.core as mx
import numpy as np

from macspec.models.home import macspec_home
from macspec.tune.examples import Example

CACHE_FILE = "tune-answers.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,
    answer BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS logprobs (
    key TEXT PRIMARY KEY,
    top_ids BLOB NOT NULL,
    top_logprobs BLOB NOT NULL
);
"""


def default_cache_path() -> Path:
    return macspec_home() / CACHE_FILE


def target_identity(folder: Path) -> str:
    """What names the target's weights without reading them: its folder, config.json, and every
    weight file's name, size and modification time (a changed file is a new target)."""
    folder = Path(folder).resolve()
    h = hashlib.sha256(str(folder).encode())
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        stat = path.stat()
        h.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    h.update(mx.__version__.encode())  # another MLX may round a near tie the other way
    return h.hexdigest()


class AnswerCache:
    """Answers and log-probabilities by key; every method is a no-op once the cache failed."""

    def __init__(self, path: Path, identity: str):
        self.path = path
        self.identity = identity
        self.problem: str | None = None
        """Why the cache is not used (said once by the caller), or None."""
        self._db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path)
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)

    def answer_key(self, prompt: list[int], max_tokens: int, temperature: float, seed) -> str:
        settings = [self.identity, prompt, max_tokens, temperature, seed]
        return hashlib.sha256(json.dumps(settings).encode()).hexdigest()

    def get_answer(self, key: str) -> list[int] | None:
        row = self._query("SELECT answer FROM answers WHERE key = ?", key)
        return None if row is None else np.frombuffer(row[0], np.int32).tolist()

    def put_answer(self, key: str, answer: list[int]) -> None:
        blob = np.asarray(answer, np.int32).tobytes()
        self._write("INSERT OR REPLACE INTO answers VALUES (?, ?)", (key, blob))

    def get_logprobs(self, example: Example, top_k: int) -> bool:
        """Fill the example's top-k from the cache; False when it is not there."""
        row = self._query(
            "SELECT top_ids, top_logprobs FROM logprobs WHERE key = ?",
            self._logprobs_key(example, top_k),
        )
        if row is None:
            return False
        shape = (example.answer_length, -1)
        example.top_ids = mx.array(np.frombuffer(row[0], np.int32).reshape(shape))
        example.top_logprobs = mx.array(np.frombuffer(row[1], np.float32).reshape(shape))
        return True

    def put_logprobs(self, example: Example, top_k: int) -> None:
        ids = np.asarray(example.top_ids, np.int32).tobytes()
        logprobs = np.asarray(example.top_logprobs, np.float32).tobytes()
        key = self._logprobs_key(example, top_k)
        self._write("INSERT OR REPLACE INTO logprobs VALUES (?, ?, ?)", (key, ids, logprobs))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _logprobs_key(self, example: Example, top_k: int) -> str:
        settings = [self.identity, example.tokens, example.offset, top_k]
        return hashlib.sha256(json.dumps(settings).encode()).hexdigest()

    def _query(self, sql: str, key: str):
        if self._db is None:
            return None
        try:
            return self._db.execute(sql, (key,)).fetchone()
        except sqlite3.Error as exc:
            self._fail(exc)
            return None

    def _write(self, sql: str, values: tuple) -> None:
        if self._db is None:
            return
        try:
            with self._db:  # one transaction per answer: an interrupted run keeps the rest
                self._db.execute(sql, values)
        except sqlite3.Error as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.problem = f"{self.path}: answers not cached ({exc}); tuning goes on without it"
        self.close()
