"""The configuration's machinery, over any dataclass of section dataclasses: TOML in, ``--section.field value``
overrides parsed and coerced to each field's type, the resolved configuration out as a dict, TOML or help text.

It knows no section: ``config`` defines them and calls these. A value that does not fit its field is one
``ConfigError`` naming the key, the value and what is accepted.

Example::

    values = {**read_toml("job.toml"), **parse_override_args(["--model.name", "mlp"])}
    cfg = apply_overrides(Config(), values)
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from .errors import ConfigError

__all__ = ["apply_overrides", "read_toml", "parse_override_args", "gather_values", "config_to_dict",
           "config_to_toml", "field_options", "describe_fields", "int_list"]

C = TypeVar("C")


def _literal_options(tp: Any) -> tuple[Any, ...]:
    """The options a ``Literal`` (possibly inside a union) allows; empty when there is none."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(o for a in typing.get_args(tp) for o in _literal_options(a))
    return ()


def _coerce(key: str, raw: Any, tp: Any) -> Any:
    """Convert ``raw`` (a CLI string or a TOML value) to the field type ``tp``, or raise ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for a in args:  # Literal options first so "auto" is not tried as a float
            try:
                return _coerce(key, raw, a)
            except ConfigError:
                continue
        raise ConfigError(key, raw, "expected " + " or ".join(_type_name(a) for a in args))
    if origin is Literal:
        for opt in args:
            if raw == opt or (isinstance(raw, str) and str(opt) == raw):
                return opt
        raise ConfigError(key, raw, "one of " + ", ".join(map(str, args)))
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return raw.lower() in ("true", "1", "yes", "on")
        raise ConfigError(key, raw, "expected true or false")
    if tp is int:
        if isinstance(raw, bool):
            raise ConfigError(key, raw, "expected an integer")
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw), 0)
        except ValueError:
            raise ConfigError(key, raw, "expected an integer") from None
    if tp is float:
        if isinstance(raw, bool):
            raise ConfigError(key, raw, "expected a number")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(key, raw, "expected a number") from None
    if tp is str:
        if isinstance(raw, (dict, list)):
            raise ConfigError(key, raw, "expected a string")
        return str(raw)
    raise ConfigError(key, raw, f"unsupported field type {tp!r}")


def _type_name(tp: Any) -> str:
    """How help text names a field's type: its options, or the type's name."""
    opts = _literal_options(tp)
    return "/".join(map(str, opts)) if opts else getattr(tp, "__name__", str(tp))


def _sections(cfg: Any) -> dict[str, Any]:
    """The sections of a configuration, by name."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def apply_overrides(cfg: C, values: dict[str, Any]) -> C:
    """Return a new, validated configuration of ``cfg``'s type with ``{"section.field": value}`` applied."""
    merged: dict[str, dict[str, Any]] = {
        name: {f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)} for name, sec in _sections(cfg).items()
    }
    for key, raw in values.items():
        section, _, fname = key.partition(".")
        if section not in merged:
            raise ConfigError(key, raw, "unknown section;" + _did_you_mean(key, merged) + " sections are "
                              + ", ".join(merged))
        sec_obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(sec_obj))
        if fname not in merged[section]:
            raise ConfigError(key, raw, f"unknown field of [{section}];" + _did_you_mean(key, merged)
                              + " fields are " + ", ".join(merged[section]))
        merged[section][fname] = _coerce(key, raw, hints[fname])
    return type(cfg)(**{name: type(getattr(cfg, name))(**fields) for name, fields in merged.items()})


def _did_you_mean(key: str, merged: dict[str, dict[str, Any]]) -> str:
    """" did you mean strategy.bucket_mb?" for a misspelled ``section.field``, else ""."""
    import difflib
    keys = [f"{sec}.{f}" for sec, fields in merged.items() for f in fields]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    return f" did you mean {close[0]}?" if close else ""


def _flatten_toml(data: dict[str, Any], path: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in data.items():
        if not isinstance(body, dict):
            raise ConfigError(section, body, f"{path}: top-level keys must be [sections] such as [model]")
        for fname, value in body.items():
            flat[f"{section}.{fname}"] = value
    return flat


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into ``{"section.field": value}``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--config", str(path), "no such file")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", str(path), f"not valid TOML ({e})") from None
    return _flatten_toml(data, str(path))


def parse_override_args(argv: list[str]) -> dict[str, str]:
    """Turn ``["--model.name", "mlp", "--a.b=c"]`` into ``{"model.name": "mlp", "a.b": "c"}``."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError("argument", arg, "expected --section.field VALUE")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(argv):
                raise ConfigError(arg[2:], None, "missing value")
            key, value = arg[2:], argv[i + 1]
            i += 2
        out[key] = value
    return out


def gather_values(argv: list[str] | None = None, config_file: str | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"section.field": value}`` of the TOML file, then ``--section.field value`` arguments, then ``extra``."""
    values: dict[str, Any] = {}
    if config_file:
        values.update(read_toml(config_file))
    values.update(parse_override_args(list(argv or [])))
    values.update(extra or {})
    return values


def config_to_dict(cfg: Any) -> dict[str, dict[str, Any]]:
    """Plain nested dict of the configuration (JSON and TOML friendly)."""
    return {name: dataclasses.asdict(sec) for name, sec in _sections(cfg).items()}


def _toml_value(v: Any) -> str:
    """One TOML value: booleans lower-case, numbers as Python writes them, anything else a quoted string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_to_toml(cfg: Any, sections: tuple[str, ...] | None = None) -> str:
    """The resolved configuration as TOML, with each field's documentation as a comment."""
    lines: list[str] = []
    for name, sec in _sections(cfg).items():
        if sections and name not in sections:
            continue
        lines.append(f"[{name}]")
        for f in dataclasses.fields(sec):
            lines.append(f"{f.name} = {_toml_value(getattr(sec, f.name))}  # {f.metadata.get('doc', '')}")
        lines.append("")
    return "\n".join(lines)


def field_options(cfg: Any, sections: tuple[str, ...] | None = None) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Per section of ``cfg``: (name, its docstring, [(--section.field, help text)]) for grouped ``--help`` pages."""
    out = []
    for name, sec in _sections(cfg).items():
        if sections and name not in sections:
            continue
        hints = typing.get_type_hints(type(sec))
        opts = []
        for f in dataclasses.fields(sec):
            default = getattr(sec, f.name)
            shown = _toml_value(default) if not isinstance(default, str) else (repr(default) if default else "''")
            opts.append((f"--{name}.{f.name}", f"{f.metadata.get('doc', '')} [{_type_name(hints[f.name])}, "
                                               f"default {shown}]"))
        out.append((name, (type(sec).__doc__ or "").strip().splitlines()[0], opts))
    return out


def describe_fields(cfg: Any, sections: tuple[str, ...] | None = None) -> str:
    """One line per field of ``cfg``: ``--section.field (type, default): doc``; used by ``--help``."""
    out = []
    for name, sec in _sections(cfg).items():
        if sections and name not in sections:
            continue
        hints = typing.get_type_hints(type(sec))
        for f in dataclasses.fields(sec):
            out.append(f"  --{name}.{f.name} ({_type_name(hints[f.name])}, default {getattr(sec, f.name)!r}): "
                       f"{f.metadata.get('doc', '')}")
    return "\n".join(out)


def int_list(text: str, key: str, accepted: str = "comma-separated integers >= 1, e.g. 1,2,4") -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4], sorted and unique: the one parser of every such option (process counts, nodes).

    Anything else (a word, an empty list, a count below 1) is one ``ConfigError`` naming ``key``, the text given
    and ``accepted``.
    """
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(key, text, accepted)
    return sorted(set(values))
