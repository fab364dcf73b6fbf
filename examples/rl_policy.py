"""A generator-coroutine RL policy under ``@torch.no_grad()``, trained between its steps.

The policy is a generator driven with ``send`` by the environment loop: it is
sent an observation and yields an action.  It is decorated with
``@torch.no_grad()`` so that acting never builds autograd graphs, and for its
first ``WARMUP`` steps it acts at random inside its own
``with torch.enable_grad():`` block, which stays open across those
``yield``\\ s, so that its network's logits track gradients there.  Between
two policy steps, in the caller, a learner trains the same network with
autograd (REINFORCE on the transitions so far).

With this patch the policy's block holds for all of its warm-up, and the
learner always runs in the caller's own mode.  On torch 2.13.0
(``TORCH_GRADMODE_OVERLAY=0``) the decorator's mode is entered afresh at every
step, overriding the block after the first: the warm-up logits track no
gradients after the first step.

Run: ``python examples/rl_policy.py`` (``--json`` also prints the report as JSON).
"""

import json
import os
import sys

import torch
import torch.utils._contextlib

N_FEATURES, N_ACTIONS = 4, 3
WARMUP, STEPS, BATCH = 40, 400, 32


class Env:
    """A contextual bandit: the best action is the argmax of a hidden linear map of the observation."""

    def __init__(self, gen):
        self.gen = gen
        self.hidden = torch.randn(N_ACTIONS, N_FEATURES, generator=gen)

    def observe(self):
        return torch.randn(N_FEATURES, generator=self.gen)

    def reward(self, obs, action):
        return 1.0 if action == int((self.hidden @ obs).argmax()) else 0.0


@torch.no_grad()
def policy(net, gen, seen):
    """Receive observations with ``send``, yield integer actions."""
    obs = yield None
    with torch.enable_grad():  # warm-up: random actions, the network's logits tracked
        for _ in range(WARMUP):
            seen["warmup_logits_require_grad"].add(net(obs).requires_grad)
            obs = yield int(torch.randint(N_ACTIONS, (), generator=gen))
    while True:
        logits = net(obs)
        probs = torch.softmax(logits, dim=-1)
        action = torch.multinomial(probs, 1, generator=gen)
        seen["body_grad_enabled"].add(torch.is_grad_enabled())
        seen["logits_require_grad"].add(logits.requires_grad)
        seen["action_requires_grad"].add(action.requires_grad)
        obs = yield int(action)


def learner_step(net, opt, buffer, stats):
    """One REINFORCE step on the latest transitions, with autograd, in the caller's mode."""
    stats["grad_enabled"].add(torch.is_grad_enabled())
    stats["inference_mode"].add(torch.is_inference_mode_enabled())
    obs = torch.stack([o for o, _, _ in buffer[-BATCH:]])
    actions = torch.tensor([a for _, a, _ in buffer[-BATCH:]])
    rewards = torch.tensor([r for _, _, r in buffer[-BATCH:]])
    try:
        logp = torch.log_softmax(net(obs), dim=-1).gather(1, actions[:, None]).squeeze(1)
        loss = -((rewards - rewards.mean()) * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        stats["steps_ok"] += 1
    except RuntimeError as e:
        stats["steps_failed"] += 1
        stats["first_error"] = stats["first_error"] or str(e).splitlines()[0]


@torch.no_grad()
def greedy_accuracy(net, env, n=500):
    """Share of fresh observations on which the greedy action is the best one."""
    return sum(env.reward(obs, int(net(obs).argmax())) for obs in (env.observe() for _ in range(n))) / n


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    env = Env(gen)
    net = torch.nn.Linear(N_FEATURES, N_ACTIONS)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    seen = {"body_grad_enabled": set(), "logits_require_grad": set(), "action_requires_grad": set(),
            "warmup_logits_require_grad": set()}
    stats = {"grad_enabled": set(), "inference_mode": set(), "steps_ok": 0, "steps_failed": 0, "first_error": None}
    buffer, rewards, inference_obs = [], [], 0
    before = greedy_accuracy(net, env)

    agent = policy(net, gen, seen)
    next(agent)
    for _ in range(STEPS):
        obs = env.observe()
        inference_obs += obs.is_inference()
        action = agent.send(obs)
        reward = env.reward(obs, action)
        buffer.append((obs, action, reward))
        rewards.append(reward)
        learner_step(net, opt, buffer, stats)
    agent.close()
    after = greedy_accuracy(net, env)
    report = {
        "contextlib": os.path.realpath(torch.utils._contextlib.__file__),
        "policy_body_grad_enabled": sorted(seen["body_grad_enabled"]),
        "policy_logits_require_grad": sorted(seen["logits_require_grad"]),
        "policy_actions_require_grad": sorted(seen["action_requires_grad"]),
        "policy_warmup_logits_require_grad": sorted(seen["warmup_logits_require_grad"]),
        "learner_grad_enabled": sorted(stats["grad_enabled"]),
        "learner_inference_mode": sorted(stats["inference_mode"]),
        "learner_steps_ok": stats["steps_ok"],
        "learner_steps_failed": stats["steps_failed"],
        "learner_first_error": stats["first_error"],
        "inference_observations": int(inference_obs),
        "greedy_accuracy_before": before,
        "greedy_accuracy_after": after,
        "mean_reward_last_100": sum(rewards[-100:]) / 100,
        "caller_grad_enabled_after": torch.is_grad_enabled(),
    }
    report["ok"] = (
        report["policy_body_grad_enabled"] == [False]
        and report["policy_logits_require_grad"] == [False]
        and report["policy_actions_require_grad"] == [False]
        and report["policy_warmup_logits_require_grad"] == [True]
        and report["learner_grad_enabled"] == [True]
        and report["learner_inference_mode"] == [False]
        and report["learner_steps_failed"] == 0
        and report["inference_observations"] == 0
        and after >= 0.8
    )
    return report


if __name__ == "__main__":
    result = main()
    print(f"torch/utils/_contextlib.py: {result['contextlib']}")
    print(f"policy body: grad enabled {result['policy_body_grad_enabled']}, "
          f"logits require grad {result['policy_logits_require_grad']}, "
          f"actions require grad {result['policy_actions_require_grad']}, "
          f"warm-up logits require grad {result['policy_warmup_logits_require_grad']}")
    print(f"learner: grad enabled {result['learner_grad_enabled']}, "
          f"inference mode {result['learner_inference_mode']}, "
          f"{result['learner_steps_ok']} steps ok, {result['learner_steps_failed']} failed"
          + (f" ({result['learner_first_error']})" if result["learner_first_error"] else ""))
    print(f"environment made {result['inference_observations']} inference-tensor observations")
    print(f"greedy accuracy before training {result['greedy_accuracy_before']:.2f}, "
          f"after {result['greedy_accuracy_after']:.2f} (chance {1 / N_ACTIONS:.2f}); "
          f"mean reward over the last 100 steps {result['mean_reward_last_100']:.2f}")
    print("OK" if result["ok"] else "FAILED")
    if "--json" in sys.argv[1:]:
        print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
