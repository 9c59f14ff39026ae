#!/usr/bin/env python3
"""The import graph of `src/`'s rooms, and a check that it has no circle.

A room is a top-level folder or file of `src/` (`keys/`, `net/`, `state.rs`, ...). A file imports
a room when it names `crate::ROOM` anywhere (a `use` line or a path in the code). `lib.rs` is the
entry point and may name every room; it is not a room. The check fails when the rooms' graph has
a circle (listing every one), and when a room imports a room of its own layer or of a layer
above (LAYERS, as docs/architecture.md draws them; the pure core may import itself). A new room
must be given a layer here. `make lint` runs it.

    python3 tools/import_graph.py           # the check
    python3 tools/import_graph.py --graph   # every room's imports, and the files behind each arrow
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PATH = re.compile(r"\bcrate::(?:\{\s*)?([a-z_][a-z0-9_]*)")
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


# The layers, bottom up (docs/architecture.md).
LAYERS = [
    ["clock", "keys", "ring", "persist", "keyindex", "test_rng"],  # pure core
    ["host"],  # the server edge
    ["net"],  # the network
    ["state"],  # settings, rings, generator
    ["topology", "index"],  # where nodes are; the key index
    ["route"],  # SHARD.CALL
    ["cluster", "reshard", "txn"],  # capabilities built on routing
    ["commands", "config", "durability", "info"],  # glue
]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def layer_problems(edges):
    """Imports that go sideways or up, and rooms given no layer."""
    out = []
    for room in sorted(edges):
        if room not in LAYER:
            out.append(f"{room} has no layer in tools/import_graph.py's LAYERS")
            continue
        for target, files in sorted(edges[room].items()):
            if target not in LAYER:
                continue
            up = LAYER[target] > LAYER[room]
            sideways = LAYER[target] == LAYER[room] and LAYER[room] != 0
            if up or sideways:
                out.append(f"{room} (layer {LAYER[room]}) imports {target} (layer {LAYER[target]}): "
                           f"{', '.join(sorted(files))}")
    return out


def room_of(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def graph():
    edges: dict[str, dict[str, set[str]]] = {}
    for f in sorted(SRC.rglob("*.rs")):
        if f == SRC / "lib.rs":
            continue
        room = room_of(f)
        edges.setdefault(room, {})
        text = strip_comments(f.read_text())
        names = set(PATH.findall(text))
        for group in GROUP.findall(text):
            names.update(re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group))
        for name in names:
            if name != room and ((SRC / name).is_dir() or (SRC / f"{name}.rs").exists()):
                edges[room].setdefault(name, set()).add(str(f.relative_to(SRC)))
    return edges


def circles(edges):
    """Tarjan's strongly connected components of more than one room."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    edges = graph()
    if "--graph" in sys.argv:
        for room in sorted(edges):
            print(f"{room} -> {', '.join(sorted(edges[room])) or '(nothing)'}")
            for target, files in sorted(edges[room].items()):
                print(f"    {target}: {', '.join(sorted(files))}")
    found = circles(edges)
    for comp in found:
        inner = [f"{a} -> {b} ({', '.join(sorted(edges[a][b]))})"
                 for a in comp for b in sorted(edges[a]) if b in comp]
        print(f"circle of imports through {', '.join(comp)}:\n  " + "\n  ".join(inner))
    layers = layer_problems(edges)
    for problem in layers:
        print(problem)
    if found or layers:
        sys.exit(1)
    print(f"no circle of imports between the {len(edges)} rooms of src/, "
          f"and each imports only layers below its own")


if __name__ == "__main__":
    main()
