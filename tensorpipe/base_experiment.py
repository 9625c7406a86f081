"""BaseExperiment: the shape of a registered experiment (Lingvo's model params).

An experiment is a small class in `params/` with UPPER_CASE knobs; variants
are subclasses that change knobs. It gives the task Params (model, loss,
`p.train`) and the input Params of each data set.

Usage:
  @model_registry.RegisterSingleTaskModel
  class Small(base_experiment.BaseExperiment):
    BATCH_SIZE = 32
    def Train(self): return SomeInput.Params().Set(batch_size=self.BATCH_SIZE)
    def Test(self): return self.Train().Set(split='test')
    def Task(self): return tasks.ClassificationTask.Params().Set(...)
"""

from tensorpipe import hyperparams


class BaseExperiment:
  """Base class of experiments; subclasses implement Train, Test and Task."""

  def Train(self) -> hyperparams.InstantiableParams:
    """Params of the training input."""
    raise NotImplementedError(f'{type(self).__name__}.Train')

  def Test(self) -> hyperparams.InstantiableParams:
    """Params of the evaluation input."""
    raise NotImplementedError(f'{type(self).__name__}.Test')

  def Dev(self) -> hyperparams.InstantiableParams:
    return self.Test()

  def Task(self) -> hyperparams.InstantiableParams:
    """Params of the task (model, loss, metrics and p.train)."""
    raise NotImplementedError(f'{type(self).__name__}.Task')

  def ModelParams(self) -> hyperparams.Params:
    """Everything the trainer needs: task, input and eval_input Params."""
    p = hyperparams.Params()
    p.Define('name', type(self).__name__, 'Name of the experiment.')
    p.Define('task', self.Task(), 'Task Params (model, loss, train).')
    p.Define('input', self.Train(), 'Training input Params.')
    p.Define('eval_input', self.Test(), 'Evaluation input Params.')
    return p

  def TaskWithInput(self, dataset: str = 'Train') -> hyperparams.Params:
    """Task Params with the input of `dataset` ('Train', 'Test' or 'Dev')."""
    p = hyperparams.Params()
    p.Define('name', type(self).__name__, 'Name of the experiment.')
    p.Define('task', self.Task(), 'Task Params (model, loss, train).')
    p.Define('input', getattr(self, dataset)(), f'{dataset} input Params.')
    return p
