"""Image classification inputs read from prepared TFDS data (download=False).

Batches follow base_input.py: image [b, h, w, c] float32 (normalised per
channel), label [b] int32. Preprocessing (image_preprocessing.py) follows the
GPipe paper's recipes:

  'cifar':    train: zero-pad `crop_padding`, random crop back to image_size,
              random horizontal flip, cutout `cutout_size`; eval: resize only.
  'imagenet': train: Inception random-resized crop to image_size + flip +
              cutout; eval: central 87.5% crop resized to image_size.
  'none':     resize to image_size only.

Usage:
  p = Cifar10Input.Params().Set(batch_size=128, split='train')
  for batch in p.Instantiate().Dataset(): ...   # batch.image, batch.label

Stock TFDS builders need the user's prepared data; a missing data set raises
tfds_utils.DataNotPreparedError at once, naming the way to prepare it.
Fashion-MNIST is prepared offline from Debian's `dataset-fashion-mnist` by
`bash tools/prepare_data.sh`.
"""

from typing import Any, Dict, Tuple

import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import hyperparams
from tensorpipe.inputs import image_preprocessing as ip
from tensorpipe.inputs import tfds_utils

_PREPROCESSING = ('cifar', 'imagenet', 'none')

# TFDS names of the paper's data sets: classes, native/default image size, the
# held-out split to evaluate on, and channel statistics.
_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
DATASETS: Dict[str, Dict[str, Any]] = {
    'fashion_mnist': dict(num_classes=10, image_size=(28, 28), eval_split='test',
                          mean=(0.2860,), stddev=(0.3530,)),
    'cifar10': dict(num_classes=10, image_size=(32, 32), eval_split='test',
                    mean=_CIFAR_MEAN, stddev=_CIFAR_STD),
    'cifar100': dict(num_classes=100, image_size=(32, 32), eval_split='test',
                     mean=(0.5071, 0.4865, 0.4409),
                     stddev=(0.2673, 0.2564, 0.2762)),
    'imagenet2012': dict(num_classes=1000, image_size=(224, 224),
                         eval_split='validation', mean=ip.IMAGENET_MEAN,
                         stddev=ip.IMAGENET_STDDEV),
    'cars196': dict(num_classes=196, image_size=(224, 224), eval_split='test',
                    mean=ip.IMAGENET_MEAN, stddev=ip.IMAGENET_STDDEV),
    'oxford_iiit_pet': dict(num_classes=37, image_size=(224, 224),
                            eval_split='test', mean=ip.IMAGENET_MEAN,
                            stddev=ip.IMAGENET_STDDEV),
    'food101': dict(num_classes=101, image_size=(224, 224),
                    eval_split='validation', mean=ip.IMAGENET_MEAN,
                    stddev=ip.IMAGENET_STDDEV),
    'caltech_birds2011': dict(num_classes=200, image_size=(224, 224),
                              eval_split='test', mean=ip.IMAGENET_MEAN,
                              stddev=ip.IMAGENET_STDDEV),
}

# Paper data sets that tensorflow-datasets 4.9.10 has no builder for.
NOT_IN_TFDS = {
    'fgvc_aircraft': 'FGVC Aircraft',
    'birdsnap': 'Birdsnap',
}


class ImageTfdsInput(base_input.BaseInput):
  """Images and labels from a prepared TFDS image classification data set."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('dataset_name', None, 'TFDS name of the data set, one of '
             f'{sorted(DATASETS)} or any TFDS image data set with image/label '
             'features (then set num_classes, image_size, mean, stddev).')
    p.Define('num_classes', None, 'Number of classes; None takes the value '
             'of DATASETS[dataset_name].')
    p.Define('image_size', None, 'Output (height, width) in pixels; None '
             'takes DATASETS[dataset_name].')
    p.Define('mean', None, 'Per-channel mean of the [0, 1]-scaled images, '
             'subtracted before dividing by stddev; None: DATASETS value.')
    p.Define('stddev', None, 'Per-channel standard deviation of the [0, '
             '1]-scaled images; None: DATASETS value.')
    p.Define('preprocessing', 'cifar', f'One of {_PREPROCESSING}: the '
             'augmentation recipe (see the module docstring).')
    p.Define('crop_padding', 4, "Zero padding in pixels per side before the "
             "random crop of the 'cifar' recipe.")
    p.Define('random_flip', True, 'Random horizontal flip when training.')
    p.Define('cutout_size', 0, 'Side in pixels of the cutout square when '
             'training; 0 disables cutout.')
    p.Define('eval_crop_fraction', 0.875, "Central crop fraction of the "
             "'imagenet' recipe at evaluation.")
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    p = params.Copy()
    if not p.dataset_name:
      raise ValueError(f'dataset_name={p.dataset_name!r}: set it to a TFDS '
                       f'name, e.g. one of {sorted(DATASETS)}')
    defaults = DATASETS.get(p.dataset_name, {})
    for key in ('num_classes', 'image_size', 'mean', 'stddev'):
      if getattr(p, key) is None:
        if key not in defaults:
          raise ValueError(
              f'{key}=None for dataset_name={p.dataset_name!r}, which is not '
              f'among {sorted(DATASETS)}: set {key} explicitly.')
        p.Set(**{key: defaults[key]})
    if p.preprocessing not in _PREPROCESSING:
      raise ValueError(f'preprocessing={p.preprocessing!r} must be one of '
                       f'{_PREPROCESSING}')
    if len(p.mean) != len(p.stddev):
      raise ValueError(f'mean={p.mean!r} and stddev={p.stddev!r} must have '
                       'one value per channel each')
    p.image_size = tuple(int(s) for s in p.image_size)
    super().__init__(p)

  @property
  def num_classes(self) -> int:
    return self.params.num_classes

  def _PrepareHint(self, data_dir: str, again: bool = False) -> str:
    """How to prepare the data set (`again`: once its folder is deleted)."""
    del again  # the same steps for stock TFDS data sets
    name = self.params.dataset_name
    if name in NOT_IN_TFDS:
      return (f'{NOT_IN_TFDS[name]} has no builder in tensorflow-datasets '
              f"4.9.10: write a TFDS builder named '{name}' (image, label "
              'features), import it so TFDS registers it, and prepare it '
              f'into {data_dir}')
    return tfds_utils.ManualPrepareHint(name, data_dir)

  def _Read(self) -> tf.data.Dataset:
    """The raw split: dicts with 'image' uint8 [h, w, c] and 'label' int."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    p = self.params
    data_dir = tfds_utils.ResolveDataDir(p.data_dir)
    tfds_utils.CheckPrepared(p.dataset_name, data_dir,
                             self._PrepareHint(data_dir))
    tfds_utils.CheckFiles(p.dataset_name, data_dir, p.split,
                          self._PrepareHint(data_dir, again=True))
    return tfds.load(
        p.dataset_name, split=p.split, data_dir=data_dir, download=False,
        shuffle_files=self.is_training,
        read_config=tfds.ReadConfig(shuffle_seed=p.seed))

  def DescribeReadError(self, error: Exception) -> str:
    """Names the damaged record file of the split and how to replace it."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    p = self.params
    data_dir = tfds_utils.ResolveDataDir(p.data_dir)
    try:
      builder = tfds.builder(p.dataset_name, data_dir=data_dir)
      files = tfds_utils.SplitFiles(builder, p.split)
    except Exception:  # pylint: disable=broad-except
      files = []
    return tfds_utils.DescribeDamage(p.dataset_name, data_dir, p.split, files,
                                     error,
                                     self._PrepareHint(data_dir, again=True))

  def _Decode(self, example: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    return {'image': example['image'],
            'label': tf.cast(example['label'], tf.int32)}

  def _Augment(self, example: Dict[str, tf.Tensor],
               seed: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Training or evaluation preprocessing of one example."""
    p = self.params
    image = example['image']
    size = p.image_size
    if p.preprocessing == 'imagenet':
      if self.is_training:
        image = ip.RandomResizedCrop(image, size, seed)
      else:
        image = ip.CenterCrop(image, size, p.eval_crop_fraction)
    else:
      image = tf.cast(image, tf.float32)
      if image.shape[0] != size[0] or image.shape[1] != size[1]:
        image = ip.Resize(image, size)
      if self.is_training and p.preprocessing == 'cifar':
        image = ip.RandomCrop(image, size, p.crop_padding, seed)
    if self.is_training and p.random_flip and p.preprocessing != 'none':
      image = ip.RandomHorizontalFlip(image, seed)
    image = ip.Normalize(image, p.mean, p.stddev)
    if self.is_training and p.cutout_size and p.preprocessing != 'none':
      image = ip.Cutout(image, p.cutout_size, seed)
    image = tf.ensure_shape(image, [size[0], size[1], len(p.mean)])
    return {'image': image, 'label': example['label']}

  def _Dataset(self) -> tf.data.Dataset:
    ds = self._Read().map(self._Decode, num_parallel_calls=tf.data.AUTOTUNE)
    return self._Finish(ds, augment=self._Augment)

  def RawImageShape(self) -> Tuple[int, int, int]:
    """[height, width, channels] of the raw images a served model takes."""
    p = self.params
    return (p.image_size[0], p.image_size[1], len(p.mean))

  def ServingPreprocess(self, images: tf.Tensor) -> tf.Tensor:
    """The evaluation preprocessing of a batch of raw images.

    Args:
      images: uint8 [b, height, width, channels] (RawImageShape).

    Returns:
      float32 [b, *image_size, channels]: what this input's evaluation
      batches hold for the same images (the serving graph's preprocessing).
    """
    p = self.params
    eval_params = p.Copy().Set(split=self._EvalSplit())
    evaluation = type(self)(eval_params) if self.is_training else self
    shape = [p.image_size[0], p.image_size[1], len(p.mean)]

    def One(image):
      return evaluation._Augment(
          {'image': image, 'label': tf.constant(0, tf.int32)},
          tf.zeros([2], tf.int64))['image']
    return tf.map_fn(One, images,
                     fn_output_signature=tf.TensorSpec(shape, tf.float32))

  def _EvalSplit(self) -> str:
    return 'test' if self.is_training else self.params.split


def _Preset(name: str, doc: str, **overrides):
  """An ImageTfdsInput subclass whose Params default to data set `name`."""

  class _Input(ImageTfdsInput):

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
      p = super().Params()
      p.Set(dataset_name=name, **overrides)
      return p

  _Input.__doc__ = doc
  return _Input


class FashionMnistInput(ImageTfdsInput):
  """Fashion-MNIST (Debian `dataset-fashion-mnist`, prepared offline).

  image [b, 28, 28, 1] float32 normalised with the data set's mean/stddev,
  label [b] int32 in [0, 10). Training: pad 2 + random 28x28 crop + flip.
  Splits: 'train' (60000), 'test' (10000); slices such as 'train[:90%]' work.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Set(dataset_name='fashion_mnist', preprocessing='cifar', crop_padding=2)
    return p

  def _PrepareHint(self, data_dir: str, again: bool = False) -> str:
    if again:
      return f'`{tfds_utils.REPREPARE_COMMAND}`'
    return (f'run `{tfds_utils.PREPARE_COMMAND}` (installs Debian '
            "'dataset-fashion-mnist' and writes it into data/tfds), or pass "
            'data_dir / $TENSORPIPE_DATA_DIR pointing at a prepared directory')


Cifar10Input = _Preset('cifar10', 'CIFAR-10: 32x32x3, 10 classes.',
                       cutout_size=16)
Cifar100Input = _Preset('cifar100', 'CIFAR-100: 32x32x3, 100 classes.',
                        cutout_size=16)
ImageNetInput = _Preset('imagenet2012', 'ILSVRC-2012, 224x224 crops.',
                        preprocessing='imagenet')
StanfordCarsInput = _Preset('cars196', 'Stanford Cars (196 classes).',
                            preprocessing='imagenet')
OxfordPetsInput = _Preset('oxford_iiit_pet', 'Oxford-IIIT Pets (37 classes).',
                          preprocessing='imagenet')
Food101Input = _Preset('food101', 'Food-101 (101 classes).',
                       preprocessing='imagenet')
CaltechBirdsInput = _Preset('caltech_birds2011',
                            'Caltech-UCSD Birds 200-2011 (200 classes).',
                            preprocessing='imagenet')
for _cls, _name in ((Cifar10Input, 'Cifar10Input'),
                    (Cifar100Input, 'Cifar100Input'),
                    (ImageNetInput, 'ImageNetInput'),
                    (StanfordCarsInput, 'StanfordCarsInput'),
                    (OxfordPetsInput, 'OxfordPetsInput'),
                    (Food101Input, 'Food101Input'),
                    (CaltechBirdsInput, 'CaltechBirdsInput')):
  _cls.__name__ = _cls.__qualname__ = _name
