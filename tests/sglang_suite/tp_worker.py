"""TEST ONLY: one rank of tests/sglang_suite/test_sglang_tp.py (not collected: no test_ prefix).

python tp_worker.py RANK INIT_METHOD ARCH FULL_FOLDER MODEL_PATH OUT_JSON

Builds SGLang's target and MTP draft at TP=2 in SGLang's runtime on gloo, activates robust as
SGLang's plugin loader does, loads both through ModelExpress's MxModelLoader from MX_MODEL_URI, then
loads the same classes with SGLang's DefaultModelLoader from FULL_FOLDER, and writes what it found.
"""

from __future__ import annotations

import json
import sys
import warnings

warnings.simplefilter("ignore")


def main() -> None:
    rank, init_method, name, full, model_path, out = sys.argv[1:7]
    rank = int(rank)
    import modelexpress.engines.sglang.adapter as adapter_module
    from modelexpress.engines.sglang.loader import MxModelLoader
    from mx_cpu_shim import CpuAcceleratorBackend  # TEST ONLY: ModelExpress 0.7.0 has no cpu backend

    from mx_strategies import activation
    from mx_strategies.observe.report import recent_reports
    from sglang_support import builders as sb

    adapter_module.accelerator_backend_for = lambda device: CpuAcceleratorBackend()
    activation.register_sglang()
    found: dict = {"rank": rank}
    with sb.sglang_runtime(rank=rank, world_size=2, init_method=init_method):
        for role, draft in (("target", False), ("draft", True)):
            built = sb.build_model(model_path, draft=draft, tp_rank=rank)
            MxModelLoader(built.load_config).load_model(
                model=built.model, model_config=built.model_config, device_config=built.device_config
            )
            reference = sb.build_model(full, draft=draft, tp_rank=rank)
            sb.native_load(reference)
            try:
                sb.assert_same_parameters(built.model, reference.model)
                found[f"{role}_same"] = True
            except AssertionError as exc:
                found[f"{role}_same"] = str(exc)[:2000]
    found["reports"] = recent_reports()
    with open(out, "w") as handle:
        json.dump(found, handle)


if __name__ == "__main__":
    main()
