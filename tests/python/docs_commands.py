"""Runs every ```sh block of README.md and docs/*.md as written, so that no documented
command can rot: each page's blocks in order, in a scratch directory of the page's own
(where build/, recipes/, bench/, scripts/ and .venv are links to the checkout's), under
`bash -e -o pipefail`; a block that exits non-zero fails the test with its output.

A block may be changed or left out only by an HTML comment right above its fence, which a
reader of the rendered page does not see and a reader of the source does, and which must say
why (the test refuses a directive without a reason):
  <!-- docs-run: skip: WHY -->            the block is not run (a GPU, a cluster, the test
                                           command itself)
  <!-- docs-run: set K=V [K=V ...]: WHY --> each `pentad train` command of the block gets
                                           these recipe overrides, last: smaller sizes
  <!-- docs-run: sub OLD => NEW: WHY -->    OLD is replaced by NEW in the block (a path
                                           outside the scratch directory)
  <!-- docs-run: fails: TEXT: WHY -->       the command line holding TEXT must exit non-zero
                                           (a documented refusal); the others must succeed
  <!-- docs-run: before: COMMAND: WHY -->   COMMAND runs first (what the page assumes exists,
                                           e.g. a checkpoint or a corpus file)
  <!-- docs-run: expect: TEXT: WHY -->      the block's output must hold TEXT
Several directives may stand above one block, one per comment.

usage: docs_commands.py REPO_ROOT WORK_DIR [PAGE ...]"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DIRECTIVE = re.compile(r"<!--\s*docs-run:\s*(skip|set|sub|fails|before|expect)\b:?\s*(.*?)\s*-->")
FENCE = re.compile(r"^```sh\s*$")
LINKED = ["build", "recipes", "bench", "scripts", ".venv", "tests"]


def blocks(page):
    """(first line number, text, directives) of each ```sh block of a page."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        directives, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith("<!--"):
            m = DIRECTIVE.search(lines[j])
            if not m:
                raise SystemExit(f"{page}:{j + 1}: a comment above a sh block that is not a "
                                 f"docs-run directive: {lines[j].strip()}")
            directives.append((m.group(1), m.group(2), j + 1))
            j -= 1
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        out.append((i + 1, "\n".join(lines[i + 1:end]), directives[::-1]))
        i = end + 1
    return out


def split_reason(kind, body, where):
    """A directive's argument and its reason (after the last ': ')."""
    if kind == "skip":
        arg, reason = "", body
    else:
        arg, sep, reason = body.rpartition(": ")
        if not sep:
            arg, reason = body, ""
    if len(reason.strip()) < 8:
        raise SystemExit(f"{where}: docs-run {kind} without a reason (write why after ': ')")
    return arg.strip()


def commands(text):
    """The block's command lines, backslash continuations joined."""
    out, current = [], ""
    for line in text.splitlines():
        if current:
            current += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            current = line
        else:
            out.append(line)
            continue
        if not line.rstrip().endswith("\\") and current.count('"') % 2 == 0:
            out.append(current)
            current = ""
    if current:
        out.append(current)
    return out


def with_overrides(command, overrides):
    """Appends K=V overrides to a `pentad train` command, before any trailing comment."""
    if not overrides or not re.search(r"pentad train\b", command):
        return command
    body, hash_, comment = command.partition("  #")
    extra = " ".join(overrides)  # after the command's own: the last value of a key wins
    return f"{body.rstrip()} {extra}" + (f"  #{comment}" if hash_ else "")


def script_for(text, directives, where):
    overrides, failing, before, expected = [], [], [], []
    for kind, body, line in directives:
        arg = split_reason(kind, body, f"{where} (directive on line {line})")
        if kind == "set":
            overrides += arg.split()
        elif kind == "sub":
            old, sep, new = arg.partition(" => ")
            if not sep or old not in text:
                raise SystemExit(f"{where}: docs-run sub {arg!r}: not OLD => NEW with OLD in the block")
            text = text.replace(old, new)
        elif kind == "before":
            before.append(arg)
        elif kind == "expect":
            expected.append(arg)
        elif kind == "fails":
            if arg not in text:
                raise SystemExit(f"{where}: docs-run fails {arg!r}: no such text in the block")
            failing.append(arg)
    lines = list(before)
    for command in commands(text):
        command = with_overrides(command, overrides)
        if any(f in command for f in failing):
            # A documented refusal: it must exit non-zero, and say something.
            lines.append(f"if {command.strip()}\nthen echo 'docs-run: expected this to fail' >&2; exit 1; fi")
        else:
            lines.append(command)
    return "\n".join(lines), expected


def run_page(repo, page, work, env):
    scratch = work / page.relative_to(repo).as_posix().replace("/", "_")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for name in LINKED:
        if (repo / name).exists():
            (scratch / name).symlink_to(repo / name)
    ran = skipped = 0
    for line, text, directives in blocks(page):
        where = f"{page.relative_to(repo)}:{line}"
        if any(kind == "skip" for kind, _, _ in directives):
            for kind, body, dline in directives:
                split_reason(kind, body, f"{where} (directive on line {dline})")
            print(f"skip {where}")
            skipped += 1
            continue
        script, expected = script_for(text, directives, where)
        start = time.time()
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=600)
        took = time.time() - start
        if proc.returncode != 0:
            print(f"FAIL {where} (exit {proc.returncode}, {took:.1f} s)\n--- script\n{script}\n"
                  f"--- output (tail)\n{(proc.stdout + proc.stderr)[-4000:]}")
            return ran, skipped, False
        missing = [e for e in expected if e not in proc.stdout + proc.stderr]
        if missing:
            print(f"FAIL {where}: its output lacks {missing}\n--- output (tail)\n"
                  f"{(proc.stdout + proc.stderr)[-4000:]}")
            return ran, skipped, False
        print(f"ok   {where} ({took:.1f} s)")
        ran += 1
    return ran, skipped, True


def main():
    repo, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    pages = [Path(p).resolve() for p in sys.argv[3:]] or \
        [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    # The calibration `pentad plan --calibrate` writes goes to the test's directory, not the
    # user's ~/.cache/pentad.
    # Commands written for a cluster (mpirun -np 8 without --oversubscribe) run here on the
    # machine's few cores.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               PATH=f"{repo / 'build'}:{os.environ['PATH']}",
               PENTAD_CALIBRATION=str(work / "calibration.json"))
    total_ran = total_skipped = 0
    ok = True
    work.mkdir(parents=True, exist_ok=True)
    for page in pages:
        ran, skipped, page_ok = run_page(repo, page, work, env)
        total_ran += ran
        total_skipped += skipped
        ok = ok and page_ok
    if not ok:
        sys.exit(1)
    print(f"every documented command runs: {total_ran} blocks ran, {total_skipped} skipped "
          f"with a reason")


if __name__ == "__main__":
    main()
