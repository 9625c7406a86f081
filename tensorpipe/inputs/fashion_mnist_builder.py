"""TFDS `fashion_mnist` prepared from local IDX files (Debian's package).

TFDS's stock builder downloads the four IDX .gz files and checks their
checksums; Debian's `dataset-fashion-mnist` ships the same images, but its .gz
files were recompressed (no original file-name header), so the checksums do not
match. This builder subclasses the stock one and replaces only
`_split_generators` to read the local files: features, parsing, name and version
stay TFDS's, so once prepared, plain
`tfds.load('fashion_mnist', data_dir=D, download=False)` reads it.
"""

import os
from typing import Dict, List, Optional

import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist

# Where Debian's `dataset-fashion-mnist` installs the files (`dpkg -L`).
DEBIAN_DIR = '/usr/share/datasets/fashion-mnist'
_FILES = {
    'train_data': 'train-images-idx3-ubyte.gz',
    'train_labels': 'train-labels-idx1-ubyte.gz',
    'test_data': 't10k-images-idx3-ubyte.gz',
    'test_labels': 't10k-labels-idx1-ubyte.gz',
}
NUM_EXAMPLES = {'train': 60000, 'test': 10000}


class LocalFashionMnist(mnist.FashionMNIST, skip_registration=True):
  """The stock `fashion_mnist` builder reading IDX files from `source_dir`.

  Usage:
    LocalFashionMnist(data_dir=D).download_and_prepare()
    tfds.load('fashion_mnist', data_dir=D, download=False)
  """

  name = 'fashion_mnist'
  # dataset_info.json records the preparing builder's module, and every
  # tfds.load('fashion_mnist') compares it with the stock builder's: with
  # this module's name on disk, each load logged "fields info.[module_name]
  # differ on disk and in the code". The data is the stock builder's, so is
  # the name written.
  __module__ = mnist.FashionMNIST.__module__

  def __init__(self, *, source_dir: Optional[str] = None,
               num_examples: Optional[Dict[str, int]] = None, **kwargs):
    """Args: source_dir: folder of the four .gz files (default DEBIAN_DIR);
    num_examples: {'train': n, 'test': m} images per file (tests)."""
    self._source_dir = source_dir or DEBIAN_DIR
    self._num_examples = num_examples or NUM_EXAMPLES
    super().__init__(**kwargs)

  def _split_generators(self, dl_manager) -> List[tfds.core.SplitGenerator]:
    paths = {}
    for key, filename in _FILES.items():
      path = os.path.join(self._source_dir, filename)
      if not os.path.exists(path):
        raise FileNotFoundError(
            f'{path} is missing: install Debian\'s Fashion-MNIST with '
            '`apt-get install dataset-fashion-mnist` (or run '
            '`bash tools/prepare_data.sh`), or pass source_dir= a folder '
            f'holding {sorted(_FILES.values())}')
      paths[key] = path
    # Nothing is downloaded: the download manager only un-gzips the local
    # files into its extraction folder (the stock reader wants raw IDX).
    paths = dl_manager.extract(paths)
    return [
        tfds.core.SplitGenerator(
            name=split,
            gen_kwargs=dict(num_examples=self._num_examples[split],
                            data_path=paths[f'{split}_data'],
                            label_path=paths[f'{split}_labels']))
        for split in ('train', 'test')
    ]


def FixModuleName(data_dir: str) -> bool:
  """Rewrites the module name of data prepared before the fix above.

  Returns:
    Whether dataset_info.json was changed.
  """
  import json  # pylint: disable=g-import-not-at-top
  path = os.path.join(data_dir, 'fashion_mnist', LocalFashionMnist.VERSION
                      if isinstance(LocalFashionMnist.VERSION, str) else
                      str(LocalFashionMnist.VERSION), 'dataset_info.json')
  if not os.path.exists(path):
    return False
  with open(path) as f:
    info = json.load(f)
  want = mnist.FashionMNIST.__module__
  if info.get('moduleName') in (None, want):
    return False
  info['moduleName'] = want
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(info, f, indent=2)
  os.replace(tmp, path)
  return True
