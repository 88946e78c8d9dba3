"""How hpu_nb joins the packages around it, by their import names, without importing them itself.

- torch_autoload: what `import torch` runs (torch's device-backend autoload, through the top-level _hpu_nb_autoload
  entry point): the emulated `hpu` device where Habana's software is absent.
- after_import: run a callback right after a module is imported (one meta path finder).
- lightning_registration: register hpu_nb's pieces with `lightning` and the standalone `pytorch_lightning` /
  `lightning_fabric` as soon as either is imported.
- flavours: hpu_nb's Lightning-derived code for the standalone packages, translated at import (`hpu_nb._standalone`).
- viewer_slot: where the layer that can draw a trace registers its viewer (core's HPUProfiler asks it).
Habana's names (`habana_frameworks`, `lightning_habana`) are found by the start-up finder outside the package,
_hpu_nb_habana_finder.py (run by hpu_nb-habana.pth), and served from hpu_nb/emulator/habana and
hpu_nb/lightning_habana_names.py. The public faces over this machinery: hpu_nb.pytorch_lightning and
hpu_nb.lightning_fabric. A new hook goes here, as a module of its own.
"""
