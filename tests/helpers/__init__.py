"""The test suite's one helpers package (importable as ``helpers``: pyproject's ``pythonpath``).

- :mod:`.headers`: safetensors header readers (tensor order, offsets, header sizes);
- :mod:`.checkpoints`: tiny layer checkpoints, ``Written`` (a checkpoint on
  disk and what a correct load of it delivers), ``write_shard`` (the one
  writer of a single safetensors file), uploads, HF/vLLM cache layouts
  and the damage the refusal tests do to a checkpoint;
- :mod:`.configs`: ``write_config``, a tiny model's ``config.json`` from a
  builder's table (tests/mtp_arch, tests/sglang_support);
- :mod:`.cpu_vllm`: ``cpu_vllm_adapter``, ModelExpress's real ``VllmAdapter``
  on a CPU (post-load pass left out or run on the CPU);
- :mod:`.engine`: ModelExpress contexts, vLLM-like configs, the stand-in
  model and adapter, loads through the real chain or one ``strategy.load``,
  and what the strategy logged or reported;
- :mod:`.faults`: the fault-injecting HTTP proxy and ``FaultyS3``;
- :mod:`.scripts`: ``scripts/*.py`` loaded as modules.

``free_port`` is ``mx_strategies.testing.loopback.free_port``; the loopback S3
server, the stand-in engine and synthetic MTP checkpoints are
``mx_strategies.testing``'s. No test module imports another test module.
"""
