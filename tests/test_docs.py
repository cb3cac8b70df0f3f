"""README.md and the guides in docs/ say only what is there: every relative link and #anchor
resolves (by GitHub's heading slugs, which mkdocs.yml's slugify matches), every
`macspec COMMAND --flag` they show is in that command's --help (read from the click command
tree typer builds, not from subprocesses), and every `--draft` choice --help lists has its row
in docs/drafters.md."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
import typer

import macspec.cli  # noqa: F401  (registers the commands on the app)
from macspec.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs" / "index.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
SHELL_BREAKS = {"|", "||", "&", "&&", ";", "<", ">", ">>", "(", ")"}


def page_lines(path: Path) -> tuple[list[str], list[str]]:
    """A page's prose lines and its code lines (fenced blocks, backslash continuations
    joined), apart."""
    prose, code, inside, pending = [], [], False, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            prose.append(line)
        elif line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            code.append(pending + line)
            pending = ""
    return prose, code


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation but - and _ dropped,
    each space a hyphen (runs are not collapsed: `a: --b` is `a---b`)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor on a page, repeated headings numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for line in page_lines(path)[0]:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found


def links(path: Path) -> list[str]:
    """Link targets in a page's prose, inline code left out."""
    targets = []
    for line in page_lines(path)[0]:
        targets += LINK.findall(INLINE_CODE.sub("", line))
    return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.name}: {broken}"


def test_the_slugs_are_githubs():
    assert (
        github_slug("Draft trees: `--draft-tree N|auto|off`") == "draft-trees---draft-tree-nautooff"
    )
    assert github_slug("The engine's contract") == "the-engines-contract"
    assert github_slug("Is it faster? `macspec bench`") == "is-it-faster-macspec-bench"


def shell_tokens(text: str) -> list[str]:
    """A command line's words, operators apart; comments dropped. Prose in inline code may
    hold an odd quote: then plain whitespace splitting."""
    text = re.sub(r"<(\w[\w./-]*)>", r"\1", text)  # placeholders such as <target>
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return text.split()


def macspec_invocations(text: str) -> list[list[str]]:
    """The words after each `macspec` (or `python -m macspec`) in a command line, up to the
    end of that command."""
    tokens = shell_tokens(text)
    found = []
    for i, token in enumerate(tokens):
        before = tokens[i - 1] if i else ""
        starts = not i or before == "-m" or before in SHELL_BREAKS or "=" in before  # env var
        if token == "macspec" and starts:
            rest = []
            for word in tokens[i + 1 :]:
                if word in SHELL_BREAKS or word == "macspec":
                    break
                rest.append(word)
            found.append(rest)
    return found


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, words after `macspec`) for every command the pages show, in code blocks and in
    inline code."""
    shown = []
    for page in PAGES:
        prose, code = page_lines(page)
        spans = [span for line in prose for span in INLINE_CODE.findall(line)]
        for text in code + spans:
            shown += [(page.name, words) for words in macspec_invocations(text)]
    return shown


def option_names(command) -> set[str]:
    """A command's flags. Typer builds on a click of its own (typer._click): the objects are
    read by what they have, not by their class."""
    names = {"-h", "--help"}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts + param.secondary_opts)
    return names


def check_invocation(root, words: list[str]) -> list[str]:
    """What in `macspec WORDS` its --help does not know: a command or a flag."""
    command, path, wrong = root, "macspec", []
    for word in words:
        word = word.strip("[]")
        if word in getattr(command, "commands", {}):
            command = command.commands[word]
            path += f" {word}"
        elif command is root and re.fullmatch(r"[a-z]+", word):
            wrong.append(f"{path} {word}: no such command")
            break
        elif re.match(r"^--?[A-Za-z]", word):
            flag = word.split("=", 1)[0]
            if flag not in option_names(command):
                wrong.append(f"{path} {flag}: not in its --help")
    return wrong


def test_every_command_and_flag_the_docs_show_is_in_its_help():
    root = typer.main.get_command(app)
    shown = shown_commands()
    assert len(shown) > 50  # the pages were read: they show many commands
    wrong = [f"{page}: {w}" for page, words in shown for w in check_invocation(root, words)]
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_a_wrong_flag_or_command_is_caught():
    root = typer.main.get_command(app)
    assert check_invocation(root, ["run", "--draft", "lookup", "--no-such-flag", "hi"])
    assert check_invocation(root, ["cache", "clear", "--json"])  # --json is cache's, not clear's
    assert check_invocation(root, ["frobnicate"])
    assert not check_invocation(root, ["cache", "--json"])
    assert not check_invocation(root, ["chat", "--no-think", "-k", "auto", "--seed=3"])


def draft_choices() -> list[str]:
    """The --draft choices `macspec run --help` lists: its help's quoted words."""
    run = typer.main.get_command(app).commands["run"]
    (draft,) = [p for p in run.params if "--draft" in getattr(p, "opts", ())]
    return re.findall(r"'([a-z0-9]+)'", draft.help)


def test_every_draft_choice_in_help_has_its_row_in_the_drafters_guide():
    choices = draft_choices()
    assert {"model", "lookup", "suffix", "auto"} <= set(choices)
    guide = (ROOT / "docs" / "drafters.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z0-9]+)` \|", guide, re.M))
    assert not set(choices) - rows, f"--draft choices without a row: {set(choices) - rows}"


def test_every_file_the_docs_name_is_there():
    """`scripts/…`, `tests/…`, `macspec/…` paths the pages name (moved scripts, renamed tests)."""
    named = set()
    for page in [*PAGES, ROOT / "scripts" / "README.md"]:
        text = page.read_text(encoding="utf-8")
        named |= set(
            re.findall(r"\b((?:scripts|tests|macspec|docs)/[\w/.-]*\w\.(?:py|md|jsonl|svg))", text)
        )
    scripts = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    named |= {
        f"scripts/{p}"
        for p in re.findall(r"(?<![\w/])((?:figures|train|capture)/\w+\.py)", scripts)
    }
    assert len(named) > 20
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, missing


def test_mkdocs_nav_lists_every_guide():
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(p.name for p in PAGES if p.parent == ROOT / "docs")


def guide_list(path: Path, prefix: str) -> list[str]:
    """A front page's list of guides: its `- [Title](PREFIXguide.md): what it covers.` lines,
    the prefix (README's `docs/`) dropped."""
    bullet = re.compile(r"^- \[[^\]]+\]\(" + re.escape(prefix) + r"[\w-]+\.md\): ")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.replace(f"]({prefix}", "](", 1) for line in lines if bullet.match(line)]


def test_the_two_front_pages_list_the_same_guides_in_the_navs_order():
    """README.md (GitHub's front page) and docs/index.md (the site's) say the same of each
    guide, word for word: one is edited, the other follows, or this fails."""
    readme = guide_list(ROOT / "README.md", "docs/")
    assert guide_list(INDEX, "") == readme
    first = [p.read_text(encoding="utf-8").split("\n\n")[1] for p in (ROOT / "README.md", INDEX)]
    assert first[0] == first[1] and "GGUF" in first[0]  # what macspec is, said once
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert [re.search(r"\(([\w-]+\.md)\)", line).group(1) for line in readme] == nav[1:]
