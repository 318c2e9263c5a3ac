"""The test suite's settings module, ``controlplane.testing.settings`` (pyproject, ``.ci/run`` and other programs
name it). What the tests are built from is in ``tests/support/``, outside the product."""
