"""TEST ONLY: loads of SGLang's real classes through ModelExpress, for tests/sglang_suite.

:class:`Checkpoint` writes a tiny checkpoint locally (the reference's), uploads it to the
test S3 server (robust's source) and makes the config-only ``model_path`` SGLang is given;
:func:`mx_load` is SGLang's call into ModelExpress; :func:`delivered_names` records what a
model's ``load_weights`` is fed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from helpers.checkpoints import upload

from . import builders as sb

HTTP_OVERHEAD = 64 * 1024  # request and response headers of the probe's and runai's GETs


class Checkpoint:
    """A tiny checkpoint: written locally (the reference's), on S3 (robust's), and a config-only model_path."""

    def __init__(self, root, name: str, s3):
        self.name = name
        self.full = str(root / f"{name}-full")
        self.tensors = sb.write_target_checkpoint(self.full, name)
        self.config_only = str(root / f"{name}-model-path")
        os.makedirs(self.config_only)
        shutil.copy(os.path.join(self.full, "config.json"), self.config_only)
        self.uri = upload(s3, self.full, name)
        self.data_bytes = sum(t.numel() * t.element_size() for t in self.tensors.values())

    def nbytes(self, names) -> int:
        return sum(self.tensors[n].numel() * self.tensors[n].element_size() for n in names)


def delivered_names(model) -> list[str]:
    """Record every name the model's load_weights is fed (the real method runs); returns the live list."""
    names: list[str] = []
    real = model.load_weights

    def load_weights(weights, *args, **kwargs):
        def seen():
            for name, tensor in weights:
                if not getattr(tensor, "is_meta", False):  # robust's dry run feeds data-less tensors first
                    names.append(name)
                yield name, tensor

        return real(seen(), *args, **kwargs)

    object.__setattr__(model, "load_weights", load_weights)
    return names


def mx_load(built):
    """SGLang's call into ModelExpress for the remote_instance / modelexpress backend (loader.py:3230)."""
    from modelexpress.engines.sglang.loader import MxModelLoader

    return MxModelLoader(built.load_config).load_model(
        model=built.model, model_config=built.model_config, device_config=built.device_config
    )


@dataclass
class Measured:
    """One load through ModelExpress: the names the model's load_weights was fed, the bytes S3 served."""

    fed: list[str]
    served: int


def measured_load(built, s3) -> Measured:
    """:func:`mx_load`, counting S3's bytes from zero; ModelExpress must hand back the module SGLang built."""
    module = built.model
    fed = delivered_names(module)
    s3.proxy.reset()
    loaded = mx_load(built)
    assert loaded is module, "ModelExpress returned another module than the one SGLang built"
    return Measured(fed, s3.bytes_served)
