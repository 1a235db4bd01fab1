"""Rendering on a machine with no display, quietly.

Without a display, MuJoCo's default GL backend (GLFW) cannot make a context and rendering
fails, and pygame's SDL prints "error: XDG_RUNTIME_DIR is invalid or not set" and ALSA
complaints although frames render fine. Before anything renders, `prepare_headless_rendering`
points MuJoCo at EGL (off-screen), SDL at its dummy drivers and XDG_RUNTIME_DIR at a private
directory. It changes only variables the user has not set, and only when there is no
display; MuJoCo reads MUJOCO_GL when it is first imported, so call this before making the
env (evaluate does, for --video).
"""

from __future__ import annotations

import os
import sys
import tempfile


def prepare_headless_rendering() -> None:
    if not sys.platform.startswith("linux") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime or not os.path.isdir(runtime):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="reflectrl-xdg-")  # mode 0700, as SDL wants
