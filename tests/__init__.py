"""hpu_nb's tests, in folders by the layer they test (hpu_nb/<layer>):

- core/: the Lightning pieces (accelerator, strategies, precision, fp8, checkpoints, profiler, registration);
- runtime/: the device seam, %hpu_info's facts, packaging and the torch builds users have;
- emulator/: the emulated Gaudi (the hpu device, habana_frameworks' surface, hpex kernels, HCCL, fp8 numerics);
- notebook/: widgets, magics, notebook kernels and the tutorials; browser/: the same in a real browser;
- traces/: profiler-trace loading and the viewer;
- third_party/: other people's Gaudi code (lightning-habana's names and seed examples, transformers / accelerate,
  optimum-habana, Model-References) and the scripts that stand for it;
- cluster/: mpirun, srun and Ray Train (only `make test-cluster` runs them).
What tests share lives in helpers/ (models, layered environments, notebook runs), the scripts they run in
dist_scripts/, plugin_examples/, plugin_behaviours_scripts/ and install_checks/, the fake Gaudi in fake_habana/.
Which tests are slow is listed in one place, suite_marks.py; how `make test` shares them between workers in
work_units.py.
"""
