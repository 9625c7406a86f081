"""The model zoo: architectures as lists of TensorPipe layer Params.

ResNet (resnet.py), AmoebaNet (amoebanet.py, amoebanet_cells.py), the
Transformer and its LM (transformer.py) and the paper's consistency CNN
(consistency_cnn.py). In the clone this package is `models` (as Bazel, pytest
and tools/ import it); `pip install` installs it as `tensorpipe.models`
(pyproject.toml), so it adds no generic top-level name to site-packages.
Modules of the zoo import each other relatively, so both names work.
"""
