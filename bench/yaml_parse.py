"""How long one blueprint YAML document can hold a web thread, before and after issue 54's bounds.

    .venv/bin/python bench/yaml_parse.py [--repeat 3]

The attack: a 389 KB document sent to PUT /api/v1/blueprints/{id}/yaml/ held a web thread for 11.5 s, and other
users' requests ran 3.7× slower meanwhile (the parse holds the GIL). This times, in this process, with no database:

- *before*: the reader as it was (PyYAML's pure-Python SafeLoader, aliases refused, 512 KB cap);
- *after*: ``fleet.blueprint_yaml.parse`` (libyaml's parser, a scan that stops at the first node past
  BLUEPRINT_YAML_MAX_NODES, BLUEPRINT_YAML_MAX_BYTES);

for documents of the attack's shapes: 389 KB as sent, and the largest each shape can be and still be read whole
(just under the new byte cap, and just under the node cap). Then the *other user*: a thread parsing a small,
ordinary blueprint document again and again; its rate alone, and while the main thread reads the 389 KB document
with either reader, and how long that read holds the thread.
"""

import argparse
import os
import sys
import threading
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

import yaml  # noqa: E402
from django.conf import settings  # noqa: E402

from controlplane.errors import ServiceError  # noqa: E402
from fleet import blueprint_yaml  # noqa: E402

KB = 1024
SMALL = """apiVersion: lockstep.io/v1
kind: Blueprint
name: gpu-base
versions:
- number: 1
  state: active
  addons:
  - {name: gpu-operator, repo: "https://helm.ngc.nvidia.com/nvidia", chart: gpu-operator, version: 24.9.0,
     namespace: gpu-operator, values: {driver: {enabled: true}, toolkit: {enabled: true}}}
  - {name: network-operator, repo: "https://helm.ngc.nvidia.com/nvidia", chart: network-operator,
     version: 24.7.0, namespace: network-operator}
"""


class BeforeLoader(yaml.SafeLoader):
    """The reader before issue 54: pure-Python, aliases and anchors refused, duplicate keys refused."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.YAMLError("anchors and aliases are not allowed")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen, duplicates = set(), set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int):
                (duplicates if key in seen else seen).add(key)
        if duplicates:
            raise yaml.YAMLError("duplicate keys")
        return super().construct_mapping(node, deep=deep)


def before(text: str):
    if len(text) > 512 * KB:
        raise ServiceError("over 512 KB")
    try:
        return yaml.load(text, Loader=BeforeLoader)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError) as error:
        raise ServiceError(str(error)) from error


def after(text: str):
    return blueprint_yaml.parse(text)


def shapes(size: int) -> dict[str, str]:
    """The attack's shapes, each ``size`` bytes or just under."""
    return {
        "flow list of ints": "[" + ",".join(["1"] * (size // 2 - 1)) + "]",
        "flow mapping": "{" + ",".join(f"k{i}: 1" for i in range(size // 12)) + "}",
        "block mapping": "".join(f"k{i}: v\n" for i in range(size // 10)),
        "block list": "- a\n" * (size // 4),
    }


def fit_nodes(text_of, limit: int) -> str:
    """The largest document of a shape (``text_of(n)`` holds about n nodes) that stays within ``limit`` nodes."""
    n = limit
    while True:
        text = text_of(n)
        count = sum(
            isinstance(e, yaml.NodeEvent) for e in yaml.parse(text, Loader=blueprint_yaml.FastSafeLoader)
        )
        if count <= limit:
            return text
        n -= max(1, count - limit)


def timed(read, text: str, repeat: int) -> tuple[float, str]:
    best, outcome = float("inf"), ""
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            read(text)
            outcome = "read"
        except ServiceError as error:
            outcome = f"refused: {str(error.detail)[:60]}"
        best = min(best, time.perf_counter() - started)
    return best, outcome


def other_user(read_big, big: str) -> tuple[float, float, float]:
    """Another user's small-document parses per second alone, and while ``read_big`` reads ``big`` in this thread
    (both hold the GIL in turn, as two requests of one web process do); and how long that read lasts."""
    done = [0]
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            after(SMALL)
            done[0] += 1

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(0.2)
    count, started = done[0], time.perf_counter()
    time.sleep(1.0)
    alone = (done[0] - count) / (time.perf_counter() - started)
    count, started = done[0], time.perf_counter()
    try:
        read_big(big)
    except ServiceError:
        pass
    held = time.perf_counter() - started
    during = (done[0] - count) / held if held > 0.05 else alone  # a read this short slows nobody measurably
    stop.set()
    thread.join()
    return alone, during, held


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cap_bytes, cap_nodes = settings.BLUEPRINT_YAML_MAX_BYTES, settings.BLUEPRINT_YAML_MAX_NODES
    print(
        f"libyaml: {yaml.__with_libyaml__}; caps: {cap_bytes} bytes, {cap_nodes} nodes, depth {blueprint_yaml.MAX_DEPTH}"
    )
    print(f"\n{'document':40} {'KB':>5} {'before (s)':>11}  {'after (s)':>10}  after's answer")
    attack = shapes(389 * KB)
    under_cap = shapes(cap_bytes - 16)
    at_node_cap = {
        "flow list of ints": fit_nodes(lambda n: "[" + ",".join(["1"] * (n - 1)) + "]", cap_nodes),
        "block mapping": fit_nodes(lambda n: "".join(f"k{i}: v\n" for i in range(n // 2)), cap_nodes),
    }
    rows = [(f"{name}, 389 KB (the attack)", text) for name, text in attack.items()]
    rows += [(f"{name}, under the byte cap", text) for name, text in under_cap.items()]
    rows += [(f"{name}, {cap_nodes} nodes", text) for name, text in at_node_cap.items()]
    for label, text in rows:
        old, _ = timed(before, text, args.repeat)
        new, outcome = timed(after, text, args.repeat)
        print(f"{label:40} {len(text) // KB:5d} {old:11.3f}  {new:10.3f}  {outcome}")
    big = attack["flow list of ints"]
    print("\nanother user's small documents, parsed in a second thread while the 389 KB flow list is read:")
    for name, read in (("before", before), ("after", after)):
        alone, during, held = other_user(read, big)
        print(
            f"  {name:6} the read lasts {held:7.3f} s; the other user parses {alone:6.0f}/s alone, "
            f"{during:6.0f}/s meanwhile ({alone / during:4.1f}x slower)"
        )


if __name__ == "__main__":
    main()
