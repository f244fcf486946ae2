"""cru-harness: Causal Routing for Unlearning and an honest unlearning harness on lm-evaluation-harness."""
import logging as _logging

__version__ = "0.1.0"

#: The one third-party notice dropped (`_QuietKernelsHub`).
KERNELS_HUB_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _QuietKernelsHub(_logging.Filter):
    """bitsandbytes (0.50 on a CPU with AVX512-BF16) warns at import that it cannot fetch an optional 4-bit kernel
    from the Hugging Face Hub, then uses its own: on an offline machine, once per process, in every command, and in
    the middle of a command's one-line errors. Only that notice is dropped; every other bitsandbytes message stays."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KERNELS_HUB_NOTICE)


_logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_QuietKernelsHub())
