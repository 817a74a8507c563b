"""`python -m structmem_gpu.llm.llamacpp_check`: does this llama-cpp-python build decode here?

`make setup` runs it once after installing: it loads the packaged SmolLM2 GGUF and decodes a
prompt of a few hundred tokens (the shape that crashed a natively built wheel on another CPU,
see the Makefile's LLAMA_CMAKE_ARGS) plus a few new tokens. A build whose kernels this CPU
lacks dies here with SIGILL or SIGSEGV, at set-up, with one line saying what to do, instead of
as a llama.cpp server that vanishes in the middle of the test suite.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    from llama_cpp import Llama

    from structmem_gpu.llm.server import packaged_smollm2_gguf

    t0 = time.monotonic()
    llm = Llama(model_path=str(packaged_smollm2_gguf()), n_ctx=1024, n_threads=2, n_batch=512,
                verbose=False, seed=0)
    prompt = "Caroline went to the support group on Monday and told Melanie about it. " * 25
    out = llm.create_completion(prompt, max_tokens=8, temperature=0.0)
    used = out["usage"]
    print(f"llama.cpp check: {used['prompt_tokens']} prompt + {used['completion_tokens']} new "
          f"tokens decoded in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
