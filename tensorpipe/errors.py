"""The one-line text of an exception, for error messages that quote it.

TensorFlow op errors start with the wrapped function's name and end with the
op, e.g. '{{function_node __wrapped__SaveV2_dtypes_41_device_/job:localhost/
replica:0/task:0/device:CPU:0}} ...; No space left on device [Op:SaveV2]';
the middle is what the user needs.
"""

import re

_FUNCTION_NODE = re.compile(r'^\{\{function_node [^}]*\}\}\s*')
_OP_SUFFIX = re.compile(r'\s*\[Op:[^\]]*\](\s*name:.*)?$')


def FirstLine(error: BaseException, limit: int = 300) -> str:
  """The first line of `error`'s message without TF's wrapping, or its type.

  Args:
    error: any exception.
    limit: at most this many characters are kept.
  """
  text = _FUNCTION_NODE.sub('', str(error).strip())
  line = text.splitlines()[0].strip() if text else ''
  line = _OP_SUFFIX.sub('', line)
  return line[:limit] or type(error).__name__
