"""Evaluate a run's latest checkpoint on fresh episodes of the true env return.

The env is built as in training but without reward normalisation or reward wrappers
(the return reported is the env's own, recorded below every wrapper anyway), and with the
observation normaliser frozen at the statistics saved in the checkpoint.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import gymnasium as gym
import numpy as np

from reflectrl.config import EVAL_MAX_STEPS, RunConfig, check_seed, env_settings, trainer_name
from reflectrl.envs import ClipObservation, episode_step_limit, is_continuous, make_env
from reflectrl.envs.atari import is_atari_env, life_lost
from reflectrl.envs.headless import prepare_headless_rendering
from reflectrl.envs.wrappers import observation_wrappers
from reflectrl.errors import UserError
from reflectrl.outputs import check_writable, write_error
from reflectrl.registry import trainer_spec
from reflectrl.runs import RunDir


def run_form(run: RunDir):
    """The registry's form of the run's trainer on the backend it trained on (its TrainerSpec)."""
    cfg = RunConfig.from_dict(run.config())
    return trainer_spec(trainer_name(cfg), cfg.backend)


def load_policy(run: RunDir, env_id: str | None = None,
                env_kwargs: dict | None = None) -> tuple[RunConfig, object, dict]:
    """The run's config, its latest checkpoint's policy (built by its trainer's TrainerSpec.load_policy)
    and that checkpoint's state. `env_id` (with `env_kwargs`): the env to act in instead of the run's,
    in the config returned too (the Python API's Run.evaluate(env=...))."""
    cfg = RunConfig.from_dict(run.config())
    if env_id is not None:
        cfg.env_id, cfg.env = env_id, dict(env_kwargs or {})
    spec = trainer_spec(trainer_name(cfg), cfg.backend)
    if not spec.load_policy:
        raise UserError(f"{run.path} {spec.no_eval or f'is a {spec.name} run, which reflectrl eval does not take'}")
    state = run.load_checkpoint()
    env = make_env(cfg.env_id, env_kwargs=cfg.env, keep_image=cnn_encoder(cfg))
    try:
        return cfg, spec.load("load_policy")(cfg, state, env), state
    except (KeyError, RuntimeError):
        raise UserError(f"checkpoint in {run.path} does not match its config.json (network shapes differ)") from None
    finally:
        env.close()


def cnn_encoder(cfg: RunConfig) -> bool:
    return env_settings(cfg).encoder == "cnn"  # runs from before the knob recorded none ("auto"): all MLPs


def eval_env(cfg: RunConfig, state: dict, agent=None, render_mode: str | None = None) -> gym.Env:
    """The env a policy is evaluated in: as in training without the reward wrappers (the observation ones, such
    as mask_velocity, stay) and the transforms for learning only, wrapped by an agent with a state of its
    own (hppo's sub-goal; a recurrent policy's memory, cleared at each episode's start), its observations
    normalised with the statistics the checkpoint saved (frozen). The Python API's predict reads the
    same observation wrappers."""
    env = make_env(cfg.env_id, wrapper=observation_wrappers(cfg.wrapper), env_kwargs=cfg.env,
                   render_mode=render_mode, keep_image=cnn_encoder(cfg), learning=False)
    if getattr(agent, "observe", None) is not None:  # it sees each info, through the env it wraps for that
        env = agent.wrap_env(env)
    normalizer = state.get("obs_normalizer")
    if env_settings(cfg).norm_obs and normalizer is not None:
        env = gym.wrappers.NormalizeObservation(env)
        env.update_running_mean = False
        env.obs_rms.mean, env.obs_rms.var, env.obs_rms.count = (
            normalizer["mean"], normalizer["var"], normalizer["count"])
        env = ClipObservation(env, env_settings(cfg).clip_obs)
    return env


def evaluate(
    run_path: str,
    episodes: int = 10,
    deterministic: bool = False,
    seed: int | None = None,
    video: str | None = None,
    max_steps: int | None = None,
    env_id: str | None = None,
    env_kwargs: dict | None = None,
) -> dict:
    """Run `episodes` episodes of the run's latest policy. Each episode stops at `max_steps`
    (default: the env's time limit, else EVAL_MAX_STEPS), so an env without a time limit
    cannot hang evaluation; such cut episodes are counted in `capped_episodes`. `env_id` (with
    `env_kwargs`): evaluate in that env instead of the run's (the Python API's Run.evaluate(env=...))."""
    if episodes < 1:
        raise UserError(f"--episodes {episodes}: must be >= 1")
    if max_steps is not None and max_steps < 1:
        raise UserError(f"--max-steps {max_steps}: must be a positive integer")
    if seed is not None:
        check_seed(seed)
    if video is not None and not video.lower().endswith(".mp4"):
        raise UserError(f"--video {video}: give a file name ending in .mp4")
    if video is not None:
        check_writable(video, "--video")  # before the episodes, not after them
        prepare_headless_rendering()  # before the first make_env: MuJoCo picks its GL backend on import
    run = RunDir.open(run_path, kind="control")
    form = run_form(run)
    if form.evaluate:  # a form that evaluates its runs itself (the JAX PPO: its JAX env, all episodes at once)
        if env_id is not None:
            raise UserError(f"a backend={run.config().get('backend')} run is evaluated in its own env: drop env")
        return form.load("evaluate")(run, episodes, deterministic, seed, video, max_steps)
    # the torch policies: imported only here, so that evaluating a backend=jax run imports no torch
    import torch

    from reflectrl.torch_setup import optimizers_without_dynamo
    from reflectrl.trainers.policies import params_sha256

    optimizers_without_dynamo()  # 2.5 s of start-up that only a compiler needs (torch_setup.py)
    cfg, agent, state = load_policy(run, env_id, env_kwargs)
    env = eval_env(cfg, state, agent, render_mode="rgb_array" if video else None)
    observe = getattr(agent, "observe", None)
    if max_steps is None:
        max_steps = episode_step_limit(env) or EVAL_MAX_STEPS
    continuous = is_continuous(env.action_space)
    atari = is_atari_env(env)
    generator = torch.Generator().manual_seed(cfg.seed + 1_000_003 if seed is None else seed)
    base_seed = cfg.seed + 1_000_003 if seed is None else seed

    returns, lengths, frames = [], [], []
    capped = 0      # cut by eval's own cap (--max-steps, or EVAL_MAX_STEPS without a time limit)
    truncated_episodes = 0  # ended by any time limit, the env's or the cap: their return is a partial sum
    for ep in range(episodes):
        obs, info = env.reset(seed=base_seed + ep)
        if observe is not None:
            observe(info, reset=True)
        done = False
        episode_return, steps = 0.0, 0
        while not done:
            if steps == max_steps:
                capped += 1
                truncated_episodes += 1
                break
            if video:
                frames.append(env.render())
            x = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
            with torch.no_grad():
                action = agent.deterministic_action(x) if deterministic else agent.act(x, generator)[0]
            a = action[0].numpy()
            if continuous:
                a = np.clip(a, env.action_space.low, env.action_space.high)
            else:
                a = int(a)
            obs, reward, terminated, truncated, info = env.step(a)
            if observe is not None:
                observe(info)
            episode_return += float(reward)  # eval adds no reward wrapper: this is the env's true return
            steps += 1
            done = terminated or truncated
            if truncated and not terminated and not (atari and life_lost(env)):
                truncated_episodes += 1
            if done and life_lost(env):  # Atari's episodic life: the game goes on after a lost life
                obs, _ = env.reset()
                done = False
            if done and atari and "episode" in info:  # the true score, with the steps of resets after lost lives
                episode_return = float(info["episode"]["r"])
        returns.append(episode_return)
        lengths.append(steps)
    env.close()

    if video:
        _write_video(Path(video), frames, env.metadata.get("render_fps", 30))
    return {
        "run": str(run.path),
        "env_id": cfg.env_id,
        "global_step": int(state["global_step"]),
        "episodes": episodes,
        "deterministic": deterministic,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "min_return": float(np.min(returns)),
        "max_return": float(np.max(returns)),
        "mean_length": float(np.mean(lengths)),
        "max_steps": int(max_steps),
        "capped_episodes": capped,
        "truncated_episodes": truncated_episodes,
        "video": video,
        "returns": returns,
        "params_sha256": params_sha256(agent),
    }


def _write_video(path: Path, frames: list, fps: int) -> None:
    """The frames as an H.264 MP4, written atomically by the ffmpeg that imageio-ffmpeg ships. It runs
    as our own subprocess so that its exit status is checked and its output, on a failure, becomes
    one line (imageio's writer prints ffmpeg's log and ignores its status: a full disk left a
    truncated file behind)."""
    import subprocess

    try:
        import imageio_ffmpeg
    except ImportError:
        raise UserError("--video needs imageio with ffmpeg: pip install 'reflectrl[plot]'") from None
    data = np.ascontiguousarray(np.stack([np.asarray(f, dtype=np.uint8) for f in frames]))
    height, width = data.shape[1:3]
    tmp = path.with_name(f".{path.name}.tmp.mp4")
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-an", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2",
           "-vcodec", "libx264", "-pix_fmt", "yuv420p", str(tmp)]
    try:
        done = subprocess.run(cmd, input=data.tobytes(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
            why = lines[-1].split("] ", 1)[-1].strip() if lines else f"exit status {done.returncode}"
            raise UserError(f"--video {path}: ffmpeg could not write the video ({why}); check that the location "
                            "is writable and has free space")
        tmp.replace(path)
    except OSError as err:
        raise UserError(write_error(err, "--video")) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
