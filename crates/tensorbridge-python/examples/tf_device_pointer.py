"""Recipe: the device pointer of a TensorFlow tensor.

TensorFlow has no public accessor for a tensor's address. `tb.asview(t)` imports it through
TF's own DLPack export (zero-copy, TF ensures the data is ready) and reports `ptr`, `device`,
`shape`, `strides` and `dtype`; the view also keeps the tensor's buffer alive, so the pointer
stays valid while you hold the view (not merely while `t` happens to be alive).

    python tf_device_pointer.py
"""

import gc

import numpy as np
import tensorflow as tf

import tensorbridge as tb


def main(device=None):
    gpus = tf.config.list_physical_devices("GPU")
    where = "/GPU:0" if (device in (None, "cuda") and gpus) else "/CPU:0"
    with tf.device(where):
        t = tf.reshape(tf.range(12, dtype=tf.float32), (3, 4))
    view = tb.asview(t)
    print(f"TF tensor on {t.device}: pointer {view.ptr:#x} ({view.device}), shape {view.shape}, "
          f"strides {view.strides} elements, {view.dtype}")  # fmt: skip
    if view.device == "cpu":
        # cross-check with TF's own buffer protocol (host tensors only)
        assert view.ptr == np.asarray(memoryview(t)).ctypes.data
    # the view keeps TF's buffer alive after the tensor object is gone
    del t
    gc.collect()
    values = np.from_dlpack(view) if view.device == "cpu" else None
    if values is not None:
        assert values[2, 3] == 11.0
    return {"ptr": view.ptr, "device": view.device}


if __name__ == "__main__":
    main()
