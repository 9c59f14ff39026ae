"""The documentation runs as shown: every redis-cli session of README.md and docs/*.md is played
against real servers with the module, and its output compared with the page (issue 31). Also:
every link between the pages leads somewhere, every page is reachable from the README and the
docs index, and the README stays short.

What a session is. A fenced code block with at least one command line, either a redis-cli
prompt, `127.0.0.1:PORT> COMMAND ...`, or a shell line, `$ redis-cli [-p PORT] [-3] [-c] COMMAND
...` (text after `#` on a shell line is a comment). The lines after a command, up to the next
command or the end of the block, are what redis-cli prints for it. Blocks without such a line
are not sessions and are not run: configuration files (redis.conf, sentinel.conf), `make`
lines, recipes written to be typed on every node of a fleet (the move from twemproxy to cluster
clients by hand: the session after it makes the same move with SHARD.RESHARD START), the ACL
recipes (tests/test_acl.py runs those), and code in other languages.

How a command runs. With the real `redis-cli --no-raw` (Debian's redis-tools), one process per
command, against the server that stands for PORT; its standard output is compared with the
page. Every port a session names (prompt, `-p`, `127.0.0.1:PORT` in an argument, the session
comment below) is replaced by a free loopback port, in the commands and in the servers'
settings, and back in the output (`127.0.0.1:PORT`, and the port after the host in CLUSTER
SLOTS); a ring digest printed for a ring whose addresses were replaced is replaced by the
digest of the ring as the page wrote it (both computed by the module, on a spare server). So
the pages show ports like 6379 and 7001, and nothing else on the machine is touched.

The only ways an output line may differ from the page (the exceptions; keep them few):
  1. Elision: a line `...` stands for any number of lines (none included); a line ending in
     `...` stands for a line starting with what comes before the `...`, and any lines after it.
  2. Fresh keys: each key SHARD.GENKEY replies is new by nature; it matches a key of the same
     length over the same alphabet (digits, or 0-9A-Za-z when the page's key has a letter, or
     0-9a-f and `-` for a UUID, whose hyphens stay where the page has them).
  3. The time of the last key: `shard_high_water_ms` in INFO matches a number of the same
     number of digits.

The session comment. An HTML comment right above a block (invisible on the rendered page) sets
up what a session needs, one instruction per line:
  `<!-- session` ... `-->` with lines
    server PORT [module args] [--server-setting value ...]   a server with the module
    sentinel PORT NAME=PORT ...     a sentinel watching those masters (helpers.sentinel:
                                    quorum 2, down-after-milliseconds 1000)
    run PORT COMMAND ...            a command run before the block; it must not fail
    kill PORT                       SIGKILL of that server, once every sentinel watching it knows
                                    its replica and the other sentinels (so that they can fail it
                                    over)
    continue                        the block goes on with the servers of the block before it
                                    (same page); without it, a block gets new servers
    poll                            each command of the block is run again (every 0.1 s, up to
                                    60 s) until its output is as shown: the block shows the end of
                                    something the servers do in the background (a failover, a
                                    fleet operation); only for commands that can be repeated
Without a comment, a block gets one server with the default settings for each port it names.
"""

import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from helpers.ports import free_port
from helpers.server import until

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LIMIT = 20 * 1024
POLL_SECONDS = 60.0

PROMPT = re.compile(r"^127\.0\.0\.1:(\d+)(?:\[\d+\])?> (.*)$")
SHELL = re.compile(r"^\$ (redis-cli\b.*)$")
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)\b")
FENCE = re.compile(r"^\s*```")


# ---------------------------------------------------------------------------------------------
# Reading the pages


@dataclass
class Step:
    """One command line of a session and the lines the page shows after it."""

    line: int  # 1-based, in the page
    port: int  # the page's port
    args: list
    resp3: bool = False
    cluster: bool = False
    expected: list = field(default_factory=list)

    @property
    def command(self):
        return self.args[0].upper() if self.args else ""


@dataclass
class Block:
    page: Path
    line: int  # the line of the opening fence
    setup: list  # the session comment's instructions, as lists of words
    steps: list

    @property
    def continues(self):
        return ["continue"] in self.setup

    @property
    def polls(self):
        return ["poll"] in self.setup

    def where(self, step=None):
        return f"{self.page.relative_to(ROOT)}:{step.line if step else self.line}"


def parse_command(text, lineno):
    prompt = PROMPT.match(text)
    if prompt:
        return Step(lineno, int(prompt.group(1)), shlex.split(prompt.group(2)))
    shell = SHELL.match(text)
    if not shell:
        return None
    words = shlex.split(shell.group(1), comments=True)[1:]
    step = Step(lineno, 6379, [])
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option == "-p":
            step.port = int(words.pop(0))
        elif option == "-h":
            host = words.pop(0)
            assert host == "127.0.0.1", f"line {lineno}: sessions run on 127.0.0.1, not {host}"
        elif option == "-3":
            step.resp3 = True
        elif option == "-c":
            step.cluster = True
        else:
            raise AssertionError(f"line {lineno}: redis-cli option {option} is not supported here")
    step.args = words
    return step


def blocks_of(page):
    """The sessions of a page, in order."""
    lines = page.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        body = lines[start + 1:j]
        steps = []
        for k, text in enumerate(body):
            step = parse_command(text, start + 2 + k)
            if step:
                steps.append(step)
            elif steps:
                steps[-1].expected.append(text.rstrip())
            elif text.strip() and any(PROMPT.match(t) or SHELL.match(t) for t in body):
                raise AssertionError(f"{page.name}:{start + 2 + k}: output before any command")
        if steps:
            out.append(Block(page, start + 1, session_comment(lines, start), steps))
        i = j + 1
    return out


def session_comment(lines, fence):
    """The instructions of a `<!-- session ... -->` comment that ends right above the fence."""
    if fence == 0 or not lines[fence - 1].rstrip().endswith("-->"):
        return []
    k = fence - 1
    while k >= 0 and "<!--" not in lines[k]:
        k -= 1
    text = " \n".join(lines[k:fence]).strip()
    assert text.startswith("<!-- session"), f"line {k + 1}: an HTML comment right above a block " \
        f"must be a session comment"
    text = text.removeprefix("<!-- session").removesuffix("-->").strip(" :\n")
    return [shlex.split(line) for line in text.split("\n") if line.strip()]


def chains():
    """Blocks grouped with the `continue` blocks that follow them: one test each."""
    out = []
    for page in PAGES:
        for block in blocks_of(page):
            if block.continues:
                assert out and out[-1][0].page == page, \
                    f"{block.where()}: `continue` needs a session before it on the same page"
                out[-1].append(block)
            else:
                out.append([block])
    return out


CHAINS = chains()


# ---------------------------------------------------------------------------------------------
# Comparing outputs


def expected_pattern(step):
    """A regular expression for the page's output of `step`, with the rules of the docstring."""
    parts = []
    for line in step.expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        if line.endswith("..."):
            parts.append(re.escape(line[:-3]) + r"[^\n]*\n(?:[^\n]*\n)*?")
            continue
        fresh = re.fullmatch(r'(\s*\d+\) )?"([0-9A-Za-z-]+)"', line)
        if step.command == "SHARD.GENKEY" and fresh:
            key = fresh.group(2)
            if "-" in key:  # a UUID: hex digits, the hyphens where they are
                pattern = "-".join(f"[0-9a-f]{{{len(g)}}}" for g in key.split("-"))
            else:
                alphabet = "[0-9]" if key.isdigit() else "[0-9A-Za-z]"
                pattern = f"{alphabet}{{{len(key)}}}"
            parts.append(re.escape(fresh.group(1) or "") + f'"{pattern}"\n')
            continue
        clock = re.fullmatch(r"shard_high_water_ms:(\d+)", line)
        if clock:
            parts.append(rf"shard_high_water_ms:\d{{{len(clock.group(1))}}}" + "\n")
            continue
        parts.append(re.escape(line) + "\n")
    return "".join(parts)


def matches(step, output):
    return re.fullmatch(expected_pattern(step), output) is not None


# ---------------------------------------------------------------------------------------------
# Running a chain


def pairs(reply):
    return dict(zip(reply[::2], reply[1::2]))


class Stage:
    """The servers and sentinels of one chain, each standing for a port of the pages."""

    def __init__(self, server_factory, sentinel_factory):
        self.server_factory = server_factory
        self.sentinel_factory = sentinel_factory
        self.ports = {}  # the page's port -> the real one
        self.servers = {}  # the page's port -> RedisServer
        self.sentinels = []
        self.digests = {}  # a real ring digest -> the page's
        self.spare = None

    # -- ports and text
    def real(self, port):
        if port not in self.ports:
            self.ports[port] = free_port()
        return self.ports[port]

    def to_real(self, text):
        text = ADDRESS.sub(lambda m: f"127.0.0.1:{self.real(int(m.group(1)))}", text)
        return str(self.real(int(text))) if text.isdigit() and int(text) in self.ports else text

    def to_page(self, text):
        back = {real: page for page, real in self.ports.items()}
        text = ADDRESS.sub(
            lambda m: f"127.0.0.1:{back.get(int(m.group(1)), int(m.group(1)))}", text)
        # CLUSTER SLOTS gives the port as an integer after the host.
        text = re.sub(r'("127\.0\.0\.1"\n *\d+\) \(integer\) )(\d+)',
                      lambda m: m.group(1) + str(back.get(int(m.group(2)), m.group(2))), text)
        for real, page in self.digests.items():
            text = text.replace(real, page)
        return text

    # -- servers
    def server(self, port, words=()):
        words = [self.to_real(w) for w in words]
        split = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
        module_args, settings = words[:split], []
        for w in words[split:]:
            if w.startswith("--"):
                settings.append([w[2:]])
            else:
                settings[-1].append(w)
        s = self.server_factory(module_args=module_args, config=[tuple(x) for x in settings],
                                start=False)
        s.port = self.real(port)
        self.servers[port] = s.start()
        assert s.port == self.real(port), "a server keeps the port it is given"

    def client(self, port):
        return self.servers[port].client()

    def ring_command(self, args, real_args):
        """Learns the page's digest of a ring given with ports that were replaced."""
        words = [a.upper() for a in args[:2]]
        if words not in (["SHARD.RING", "SET"], ["SHARD.RING", "BEGIN"],
                         ["SHARD.RESHARD", "START"]) or args == real_args:
            return
        spec, real_spec = args[2:], real_args[2:]
        if len(spec) > 2 and spec[-2].upper() == "MAXRATE":
            spec, real_spec = spec[:-2], real_spec[:-2]
        if self.spare is None:
            self.spare = self.server_factory().client()
        digests = []
        for s in (real_spec, spec):
            self.spare.execute_command("SHARD.RING", "SET", *s)
            digests.append(pairs(self.spare.execute_command("SHARD.RING", "GET"))[b"digest"])
        self.digests[digests[0].decode()] = digests[1].decode()

    def setup(self, block):
        for words in block.setup:
            what, rest = words[0], words[1:]
            if what == "server":
                self.server(int(rest[0]), rest[1:])
            elif what == "sentinel":
                masters = dict(m.split("=") for m in rest[1:])
                masters = {name: self.real(int(port)) for name, port in masters.items()}
                self.sentinels.append(self.sentinel_factory(masters, self.real(int(rest[0]))))
            elif what == "run":
                port, args = int(rest[0]), rest[1:]
                real_args = [self.to_real(a) for a in args]
                self.ring_command(args, real_args)
                self.client(port).execute_command(*real_args)
            elif what == "kill":
                self.kill(int(rest[0]))
            elif what not in ("continue", "poll"):
                raise AssertionError(f"{block.where()}: unknown session instruction {what!r}")
        for step in block.steps:
            if step.port not in self.servers:
                self.server(step.port)

    def kill(self, port):
        real = self.real(port)
        for sentinel in self.sentinels:
            for name, master in sentinel.masters.items():
                if master != real:
                    continue
                others = len(self.sentinels) - 1
                c = sentinel.client()
                until(lambda: any(b"s_down" not in pairs(r)[b"flags"]
                                  for r in c.execute_command("SENTINEL", "REPLICAS", name)),
                      f"the sentinel on {sentinel.port} knows {name}'s replica", POLL_SECONDS)
                until(lambda: int(pairs(c.execute_command("SENTINEL", "MASTER", name))
                                  [b"num-other-sentinels"]) == others,
                      f"the sentinel on {sentinel.port} knows the other sentinels of {name}",
                      POLL_SECONDS)
        self.servers[port].stop(signal.SIGKILL)

    # -- commands
    def run(self, step):
        real_args = [self.to_real(a) for a in step.args]
        self.ring_command(step.args, real_args)
        argv = ["redis-cli", "--no-raw", "-h", "127.0.0.1", "-p", str(self.real(step.port))]
        argv += ["-3"] * step.resp3 + ["-c"] * step.cluster + real_args
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        out = "".join(line.rstrip() + "\n" for line in done.stdout.splitlines())
        return self.to_page(out), done.stderr


def chain_id(chain):
    return chain[0].where()


@pytest.mark.parametrize("chain", CHAINS, ids=[chain_id(c) for c in CHAINS])
def test_session_runs_as_shown(chain, server_factory, sentinel_factory):
    stage = Stage(server_factory, sentinel_factory)
    for block in chain:
        stage.setup(block)
        for step in block.steps:
            deadline = time.monotonic() + (POLL_SECONDS if block.polls else 0)
            while True:
                out, err = stage.run(step)
                if matches(step, out) or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            shown = "\n".join(step.expected)
            assert matches(step, out), (
                f"{block.where(step)}: `{' '.join(step.args)}` printed\n{out}{err}"
                f"where the page shows\n{shown}")


# ---------------------------------------------------------------------------------------------
# Rules of the rules: they must be able to fail


def test_the_comparison_can_fail():
    step = Step(1, 6379, ["SHARD.GENKEY"], expected=['"2124290981632159744"'])
    assert matches(step, '"2125375436329332736"\n')
    assert not matches(step, '"212537543632933273"\n')  # one digit short
    assert not matches(step, '(error) ERR x\n')
    step = Step(1, 6379, ["SHARD.ENCODE", "TIME", "1"], expected=['"1724551110456266755"'])
    assert not matches(step, '"1724551110456266756"\n')  # only GENKEY's keys are fresh
    step = Step(1, 6379, ["SHARD.RING", "GET"], expected=['1) "algo"', "...", '3) "x"'])
    assert matches(step, '1) "algo"\n2) "a"\n3) "x"\n')
    assert matches(step, '1) "algo"\n3) "x"\n')
    assert not matches(step, '1) "algo"\n2) "a"\n')
    step = Step(1, 6379, ["INFO", "shard"], expected=["shard_high_water_ms:1795305412170",
                                                      "shard_ring_epoch:0"])
    assert matches(step, "shard_high_water_ms:1795563966248\nshard_ring_epoch:0\n")
    assert not matches(step, "shard_high_water_ms:1795563966248\nshard_ring_epoch:1\n")


def test_every_page_has_been_read():
    """The pages hold sessions, and each chain holds commands (a parser that found nothing would
    let every test above pass)."""
    pages = {c[0].page for c in CHAINS}
    assert README in pages
    assert len(pages) > 1
    assert all(step.args for chain in CHAINS for block in chain for step in block.steps)


# ---------------------------------------------------------------------------------------------
# Links


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(page):
    """The page's lines outside code blocks."""
    inside = False
    for line in page.read_text().split("\n"):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield line


def anchors(page):
    """GitHub's anchors of the page's headings."""
    seen = {}
    for line in prose(page):
        heading = re.match(r"^#{1,6} (.*)$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        yield slug if n == 0 else f"{slug}-{n}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_lead_somewhere(page):
    broken = []
    for line in prose(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in set(anchors(dest)):
                broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def linked_pages(page):
    return {(page.parent / t.partition("#")[0]).resolve()
            for line in prose(page) for t in LINK.findall(line) if not re.match(r"^[a-z]+:", t)}


def test_every_page_is_reachable_from_the_readme_and_the_index():
    pages = {p.resolve() for p in DOCS.glob("*.md")} - {(DOCS / "README.md").resolve()}
    assert pages, "docs/ has no pages"
    for index in (README, DOCS / "README.md"):
        missing = pages - linked_pages(index)
        assert not missing, f"{index.relative_to(ROOT)} links to none of " + \
            ", ".join(sorted(p.name for p in missing))


def test_the_readme_is_short():
    assert len(README.read_bytes()) < README_LIMIT, "the reference belongs in docs/"
