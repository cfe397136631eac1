"""A model from what a user names on the command line or in ``mp.report(model=...)``: a
preset name, a Hugging Face ``config.json``, or a meshplan ModelSpec JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from meshplan.errors import ConfigError, MeshplanError, UnknownPresetError, unknown_name_error
from meshplan.spec.model import ModelSpec


def load_model(text: str) -> ModelSpec:
    """A preset name, a Hugging Face ``config.json`` (or a model directory holding one), or a
    meshplan ModelSpec JSON file (an object with ``name``, ``num_layers`` and
    ``hidden_size`` and no ``model_type`` / ``architectures``, as ``ModelSpec.to_dict``
    writes it).

    ``text`` is a path when it ends in ``.json``, holds a path separator, or is an existing
    directory that is not a preset's name (``mymodel`` as well as ``./mymodel``). A bare
    name that is both a preset and a directory is the preset; write ``./NAME`` for the
    directory."""
    from meshplan.spec.presets import MODEL_PRESETS
    if (text.endswith(".json") or os.path.sep in text
            or (text not in MODEL_PRESETS and Path(text).is_dir())):
        path = Path(text)
        if path.is_dir():
            return ModelSpec.from_hf_config(path)   # a model directory: its config.json
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"model file {text!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read model file {text!r}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model file {text!r} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"model file {text!r} must hold a JSON object (a Hugging Face "
                              f"config or a meshplan ModelSpec), got {type(data).__name__}")
        if _is_modelspec_json(data):
            try:
                return ModelSpec.from_dict(data)
            except MeshplanError as exc:
                raise ConfigError(f"model file {text!r}: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"model file {text!r} is not a valid meshplan ModelSpec: "
                                  f"{exc}") from None
        return ModelSpec.from_hf_config(path)
    if text in MODEL_PRESETS:
        return ModelSpec.preset(text)
    error = unknown_name_error("model preset", text, MODEL_PRESETS)
    raise UnknownPresetError(f"{error} (a model can also be a directory holding a config.json, "
                             f"a Hugging Face config.json or a ModelSpec JSON file; no "
                             f"directory {text!r} exists)")


def _is_modelspec_json(data: dict) -> bool:
    return ({"name", "num_layers", "hidden_size"} <= set(data)
            and not {"model_type", "architectures"} & set(data))
