"""Fake habana_frameworks.torch: importing it loads the whole stack, as Habana's does (torch/__init__.py, 1.19).

The activity profiler swaps torch's profiler classes; core registers `torch.hpu` (and, in eager mode, the
"hpu_backend" for torch.compile) and sets HABANA_PROFILE; distributed.hccl initialises the distributed environment
from the launcher's variables (it may set MASTER_ADDR / MASTER_PORT) and registers "hccl"; then hpu. There is no
`__version__`: the version is the `habana-torch-plugin` distribution's (install_fake_habana writes its dist-info).
"""

from habana_frameworks._fake import STATE as _STATE

if _STATE.config.import_error:
    raise ImportError(_STATE.config.import_error)

_STATE.calls.record("import habana_frameworks.torch")

import habana_frameworks.autoload  # noqa: E402

habana_frameworks.autoload.is_loaded = True  # as Habana's: the autoload entry point must not import it again

from hpu_nb.emulator import hpu_device as _hpu_device  # noqa: E402

# Habana's library registers HPU hooks whose hasHPU() is always true (backend/habana_device/HPUHooksInterface.cpp):
# from here torch.accelerator is hpu, with no card acquired (Lightning passes device_id=hpu:0 to init_process_group).
_hpu_device.announce()

import habana_frameworks.torch.activity_profiler  # noqa: E402
import habana_frameworks.torch.core  # noqa: E402
import habana_frameworks.torch.distributed.hccl  # noqa: E402
import habana_frameworks.torch.hpu  # noqa: E402
