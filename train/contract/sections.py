"""The spec's typed `model` and `data` sections, and the one unknown-key check every config reader uses.

Pure Python (no torch, no transformers), so the launcher validates a sweep's model and data with the
same code the job runs, before anything is submitted. What needs the model's vocabulary or the files
themselves (vocab ranges, tokenizer loading) is checked where those exist: train/data/sources.py and
train/model.py.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Mapping

from train.contract.common import DataError, FedshardError, SpecError
from train.contract.presets import PRESETS


def reject_unknown(where: str, raw: Mapping, known: Iterable[str], error: type[FedshardError] = SpecError) -> None:
    """`unknown <where> key(s): a, b` for keys of `raw` outside `known`."""
    unknown = sorted(map(str, set(raw) - set(known)))
    if unknown:
        raise error(f"unknown {where} key(s): {', '.join(unknown)}")


@dataclass(frozen=True)
class Limit:
    """What a value must be beyond its type, in the words its error line uses."""

    says: str
    holds: Callable[[typing.Any], bool]


POSITIVE = Limit("a positive integer", lambda v: v >= 1)
COUNT = Limit("an integer >= 0", lambda v: v >= 0)
ABOVE_ZERO = Limit("> 0", lambda v: v > 0)


def one_of(choices: tuple[str, ...]) -> Limit:
    return Limit(f"one of {', '.join(choices)}", lambda v: v in choices)


def key(default=dataclasses.MISSING, doc: str = "", limit: Limit | None = None, *, factory=dataclasses.MISSING,
        required: bool = False):
    """A config field: its default, the line the keys page gives it, its limit, and whether conf/ must set it (the
    registered default is then Hydra's `???`)."""
    return field(default=default, default_factory=factory,
                 metadata={"doc": doc, "limit": limit, "required": required})


def check_fields(obj, where: str, error: type[Exception]) -> None:
    """Every field of its annotated type (check_types), then within its limit (its metadata): one line naming the
    first key that is not."""
    check_types(obj, where, error)
    for f in dataclasses.fields(obj):
        limit, value = f.metadata.get("limit"), getattr(obj, f.name)
        if limit is not None and not limit.holds(value):
            raise error(f"{where}.{f.name} must be {limit.says}, got {value!r}")


def registered(cls) -> dict:
    """A config dataclass's defaults as YAML would hold them (`???` where conf/ must set the key): the node
    launcher.settings registers with Hydra's ConfigStore, so no YAML file copies them."""
    out = {"kind": cls.kind} if hasattr(cls, "kind") else {}
    for f in dataclasses.fields(cls):
        value = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out[f.name] = "???" if f.metadata.get("required") else list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True)
class ModelSection:
    """A preset's Llama shapes, with any LlamaConfig key overriding them (`{"preset": "tiny", "vocab_size": 511}`),
    or explicit shapes with no preset. Which keys LlamaConfig accepts is checked by train.model.llama_config."""

    preset: str | None = "tiny"
    shapes: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Mapping) -> "ModelSection":
        if not isinstance(raw, Mapping):
            raise SpecError(f"model must be a mapping, got {raw!r}")
        shapes = dict(raw)
        preset = shapes.pop("preset", None)
        if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
            raise SpecError(f"unknown model preset {preset!r}; expected one of {', '.join(PRESETS)}")
        if preset is None and "hidden_size" not in shapes:
            raise SpecError("model needs a preset or explicit shapes (hidden_size, num_hidden_layers, ...)")
        return cls(preset, shapes)

    @property
    def llama_kwargs(self) -> dict:
        return {**PRESETS.get(self.preset, {}), **self.shapes}

    def to_dict(self) -> dict:
        return {**({"preset": self.preset} if self.preset is not None else {}), **self.shapes}


@dataclass(frozen=True)
class SyntheticData:
    """A seeded Markov chain, whose entropy rate gives the best achievable perplexity, reported beside ours. Drawn
    by train.data.sources.SyntheticSource."""

    kind: ClassVar[str] = "synthetic"
    vocab: int | None = key(None, "tokens of the chain (null: min(model vocab, 512))",
                            Limit("a positive integer", lambda v: v is None or v >= 1))
    branching: int = key(8, "successors per token", POSITIVE)
    eval_sequences: int = key(64, "held-out sequences", POSITIVE)


@dataclass(frozen=True)
class TextData:
    """Local text (.txt, .jsonl, .parquet) packed into blocks with a tokenizer from a local directory. Read by
    train.data.sources.TextSource."""

    kind: ClassVar[str] = "text"
    SUFFIXES: ClassVar[tuple[str, ...]] = (".txt", ".jsonl", ".parquet")
    paths: list[str] = key(doc="files or directories, e.g. [/data/clean_mc4_it]",
                           limit=Limit("a non-empty list of paths", lambda v: len(v) > 0), factory=list,
                           required=True)
    tokenizer: str = key("", "a local tokenizer directory (nothing is downloaded)",
                         Limit("a local directory path", lambda v: v != ""), required=True)
    eval_fraction: float = key(0.01, "tail blocks held out for evaluation", Limit("in (0, 1)", lambda v: 0 < v < 1))
    text_key: str = key("text", "field/column holding the text in jsonl/parquet")

    def files(self) -> list[Path]:
        """The text files the paths name, in a fixed order; missing paths or tokenizer directory are named.
        The launcher calls this before submitting (the login node sees the shared filesystem), the job again."""
        if not Path(self.tokenizer).is_dir():
            raise DataError(f"data.tokenizer directory does not exist: {self.tokenizer}")
        files = []
        for p in map(Path, self.paths):
            if not p.exists():
                raise DataError(f"data path does not exist: {p}")
            if p.is_dir():
                files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in self.SUFFIXES)
            elif p.suffix in self.SUFFIXES:
                files.append(p)
            else:
                raise DataError(f"unsupported data file {p} (expected .txt, .jsonl or .parquet)")
        if not files:
            raise DataError(f"no .txt/.jsonl/.parquet files found in {', '.join(self.paths)}")
        parquet = next((f for f in files if f.suffix == ".parquet"), None)
        if parquet is not None and importlib.util.find_spec("pyarrow") is None:
            raise DataError(f"reading {parquet} needs pyarrow, which is not installed: pip install 'fedshard[parquet]'")
        return files


def check_types(obj, where: str, error: type[Exception], show=repr) -> None:
    """Every field of a dataclass instance of the type its annotation names, else one line naming the key: the
    dataclasses are the one schema, so a key added later is checked too."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not matches(value, hints[f.name]):
            form = f" (on the command line: {where}.{f.name}=[a,b])" if describe(hints[f.name]).startswith("a list") \
                and not isinstance(value, list) else ""
            raise error(f"{where}.{f.name} must be {describe(hints[f.name])}, got {show(value)}{form}")


def matches(value, hint) -> bool:
    """isinstance for the annotations used in configs: int, float, str, bool, dict, list[X], dict[K, V],
    tuple[X, ...], X | None (a bool is not a number; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if origin is tuple:
        return (isinstance(value, (list, tuple)) and len(value) == len(args)
                and all(matches(v, a) for v, a in zip(value, args)))
    if hint in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if hint is float else hint)


def describe(hint) -> str:
    """An annotation in words, for error lines: 'an integer', 'a number or null', 'a list of strings'..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    if origin is list:
        return f"a list of {describe(args[0]).split(' ', 1)[1]}s"
    if origin is dict:
        return f"a mapping of {describe(args[0]).split(' ', 1)[1]}s to {describe(args[1]).split(' ', 1)[1]}s"
    if origin is tuple:
        return f"a list of {len(args)} {describe(args[0]).split(' ', 1)[1]}s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
            list: "a list", type(None): "null"}[hint]


@dataclass(frozen=True)
class TokensData:
    """A directory prepared once by `python -m train.data.prepare` (docs/training.md): every rank memory-maps its
    shards, and one epoch draws each block once (train.data.tokens.TokensSource)."""

    kind: ClassVar[str] = "tokens"
    path: str = key("", "the --out directory of python -m train.data.prepare",
                    Limit("a directory prepared by python -m train.data.prepare", lambda v: v != ""), required=True)
    tokenizer: str | None = key(None, "optional: refused unless it is the tokenizer the directory was prepared with",
                                Limit("a local directory path or null", lambda v: v is None or v != ""))
    epochs: float | None = key(None, "optional: train.steps must cover exactly this many epochs (checked before "
                                     "submission)", Limit("a number > 0 or null", lambda v: v is None or v > 0))


DataSection = SyntheticData | TextData | TokensData
DATA_KINDS: dict[str, type] = {cls.kind: cls for cls in (SyntheticData, TextData, TokensData)}


def data_section(raw: Mapping) -> DataSection:
    """The typed data section of a spec or sweep: its kind, no unknown keys, values of the right type."""
    if not isinstance(raw, Mapping) or "kind" not in raw:
        raise DataError(f"data must be a mapping with a 'kind' key, got {raw!r}")
    raw = dict(raw)
    kind = raw.pop("kind")
    if not isinstance(kind, str) or kind not in DATA_KINDS:
        raise DataError(f"unknown data kind {kind!r} (expected {' or '.join(map(repr, DATA_KINDS))})")
    cls = DATA_KINDS[kind]
    reject_unknown(f"data (kind {kind!r})", raw, (f.name for f in dataclasses.fields(cls)), DataError)
    section = cls(**raw)
    check_fields(section, "data", DataError)
    return section


def data_to_dict(section: DataSection) -> dict:
    return {"kind": section.kind, **dataclasses.asdict(section)}
