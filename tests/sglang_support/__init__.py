"""TEST ONLY: SGLang 0.5.23's real model classes, tiny, on the CPU (see :mod:`sglang_support.builders`)."""
