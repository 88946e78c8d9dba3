"""habana_frameworks, emulated by hpu_nb on the CPU (no Gaudi software is installed here)."""

__emulated__ = True
