"""The text of an exception, for error messages that quote it.

Three wrappers hide the message the user needs, and `Message` / `FirstLine`
remove each:

  * AutoGraph: an error raised while tracing a converted function starts
    with 'in user code:', then the user's frames; its last line is the
    original 'ValueError: message'.
  * TensorFlow op errors start with the wrapped function's name and end with
    the op, e.g. '{{function_node __wrapped__SaveV2_dtypes_41_device_/job:
    localhost/replica:0/task:0/device:CPU:0}} ...; No space left on device
    [Op:SaveV2]'; the middle is the message.
  * Keras wraps an exception raised in a layer's call: 'Exception encountered
    when calling X.call().', for a symbolic call 'Could not automatically
    infer the output shape ...', then the cause, then 'Arguments received
    by ...', in ANSI bold.

  errors.FirstLine(e)        # 'Input to reshape is a tensor with 3 values...'
"""

import re

_AUTOGRAPH = 'in user code:'
_ANSI = re.compile(r'\x1b\[[0-9;]*m')
_FUNCTION_NODE = re.compile(r'^\{\{function_node [^}]*\}\}\s*')
_OP_SUFFIX = re.compile(r'\s*\[Op:[^\]]*\](\s*name:.*)?$')
_KERAS_WRAPPERS = ('Exception encountered when',
                   'Could not automatically infer')
_KERAS_ARGUMENTS = 'Arguments received by'


def Message(error: BaseException) -> str:
  """`error`'s message, stripped, without AutoGraph's 'in user code:' frames.

  Of an AutoGraph error, the original message is its last line, less the
  'ValueError: ' of the error's own type.
  """
  text = str(error).strip()
  if text.startswith(_AUTOGRAPH):
    last = [line.strip() for line in text.splitlines() if line.strip()][-1]
    prefix = f'{type(error).__name__}: '
    text = last[len(prefix):] if last.startswith(prefix) else last
  return text


def FirstLine(error: BaseException, limit: int = 300) -> str:
  """The first line of `error`'s message without the wrappers, or its type.

  Args:
    error: any exception.
    limit: at most this many characters are kept.
  """
  text = _FUNCTION_NODE.sub('', _ANSI.sub('', Message(error)))
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  line = lines[0] if lines else ''
  for candidate in lines:
    if candidate.startswith(_KERAS_ARGUMENTS):
      break
    if not candidate.startswith(_KERAS_WRAPPERS):
      line = candidate
      break
  line = _OP_SUFFIX.sub('', line)
  return line[:limit] or type(error).__name__
