"""Shared by the campaign tools (scripts/perf-decks, scripts/sweep, scripts/report).

Decks are read with tomllib (Python 3.11) and written back by a small writer
for the flat sections cubelm decks have. A run directory holds one run of a
campaign (docs/perf-runs.md):

    deck.toml       the deck that ran (written by scripts/sweep)
    run.json        what the sweep knows of the run: campaign, mode, ranks, jobs, status
    check.json      `cubelm check deck.toml --json`: layout, sizes, closed-form traffic
    metrics.jsonl   one JSON object per step (log.metrics)
    train.log       the output of `cubelm train`
"""

import json
import math
import os
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("cubelm: the campaign tools need Python 3.11 or later (tomllib); "
             f"this is {sys.version.split()[0]}: set CUBELM_PYTHON to a newer python3")

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
"""The checkout these tools belong to."""

MODES = ("none", "1d", "1d+sp", "2d", "3d")
"""Tensor-parallel modes as the campaign tools name them (1d+sp: 1D with sequence parallelism)."""

RUN_FILES = ("deck.toml", "metrics.jsonl")
"""What every run directory must hold."""


class UserError(Exception):
    """A mistake in the input (a file, an argument): printed as one message, exit status 2."""


def main_guard(tool, main):
    """Runs main(); a UserError becomes 'tool: error: message' and exit status 2."""
    try:
        sys.exit(main())
    except UserError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def load_deck(path):
    """The deck at path as a dict of sections; UserError naming the file on failure."""
    try:
        with open(path, "rb") as f:
            deck = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such deck file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not a valid TOML deck: {e}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the deck: {e.strerror}") from None
    for name, section in deck.items():
        if not isinstance(section, dict):
            raise UserError(f"{path}: '{name}' is not a [section]: cubelm decks hold only "
                            "sections of key = value lines")
    return deck


def _toml_value(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{where}: {value} cannot be written to a deck")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    raise UserError(f"{where}: a {type(value).__name__} value cannot be written to a deck")


def deck_text(deck, header=""):
    """TOML text of a deck (sections of scalars), with header lines as comments first."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    for name, section in deck.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        for key, value in section.items():
            lines.append(f"{key} = {_toml_value(value, f'{name}.{key}')}")
    return "\n".join(lines) + "\n"


def get(deck, section, key, default):
    return deck.get(section, {}).get(key, default)


def mode_of(deck, path="deck"):
    """'none', '1d', '1d+sp', '2d' or '3d'; UserError for any other tensor mode."""
    mode = get(deck, "parallel", "tensor_mode", "none")
    if mode not in ("none", "1d", "2d", "3d"):
        raise UserError(f"{path}: parallel.tensor_mode = {json.dumps(mode)}: unknown mode "
                        "(the modes are \"none\", \"1d\", \"2d\", \"3d\")")
    if get(deck, "parallel", "sequence_parallel", False):
        if mode != "1d":
            raise UserError(f"{path}: parallel.sequence_parallel = true needs "
                            f"tensor_mode = \"1d\", not {json.dumps(mode)}")
        return "1d+sp"
    return mode


def world_of(deck):
    """Ranks the deck's layout needs: data_size x pipeline_size x context_size x tensor_size."""
    p = deck.get("parallel", {})
    return (int(p.get("data_size", 1)) * int(p.get("pipeline_size", 1)) * int(p.get("context_size", 1))
            * int(p.get("tensor_size", 1)))


def layout_text(deck):
    """'tp 2d:4 x dp 2' and the like: the parts of the layout that are not 1."""
    p = deck.get("parallel", {})
    mode = mode_of(deck)
    parts = [f"tp {mode}:{p.get('tensor_size', 1)}"] if mode != "none" else ["1 rank"]
    if p.get("pipeline_size", 1) > 1:
        parts.append(f"pp {p['pipeline_size']}")
    if p.get("context_size", 1) > 1:
        parts.append(f"cp {p['context_size']}")
    if p.get("data_size", 1) > 1:
        parts.append(f"dp {p['data_size']}")
    return " x ".join(parts)


def model_text(deck):
    """The model's shape, e.g. 'L12 H768 a12 T1024 V50257'."""
    m = deck.get("model", {})
    return (f"L{m.get('layers', 2)} H{m.get('hidden', 64)} a{m.get('heads', 4)} "
            f"T{m.get('seq_len', 64)} V{m.get('vocab_size', 256)}")


def read_json(path):
    """A JSON file holding one object; UserError naming the file when it does not."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: expected one JSON object, found a {type(value).__name__}")
    return value


def write_json(path, value):
    """Writes value as JSON, atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
