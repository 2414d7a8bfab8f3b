"""RLlib's tutorial Policies example, as its docs write it, with torch in place of TensorFlow and
rlrun's import line: a loss function -> build_torch_policy -> build_trainer. Selected from YAML with
``algo=pg algo.name=ClassicPGTrainer loss=custom loss.name=ClassicPGPolicy 'plugins=[classic_pg]'``."""

from rlrun import Postprocessing, SampleBatch, build_torch_policy, build_trainer, compute_advantages


def policy_gradient_loss(policy, model, dist_class, train_batch):
    logits, _ = model({SampleBatch.CUR_OBS: train_batch[SampleBatch.CUR_OBS]})
    action_dist = dist_class(logits)
    log_probs = action_dist.logp(train_batch[SampleBatch.ACTIONS])
    return -train_batch[SampleBatch.REWARDS].dot(log_probs)


# <class 'rlrun.algos.classic.MyTorchPolicy'>
MyTorchPolicy = build_torch_policy(name="MyTorchPolicy", loss_fn=policy_gradient_loss)
MyTrainer = build_trainer(name="MyCustomTrainer", default_policy=MyTorchPolicy)


# the tutorial's next step: advantages from a postprocess function (its loss reads them)
def postprocess_advantages(policy, sample_batch, other_agent_batches=None, episode=None):
    return compute_advantages(sample_batch, 0.0, policy.config["gamma"], use_gae=False, use_critic=False)


def advantage_loss(policy, model, dist_class, train_batch):
    logits, _ = model.from_batch(train_batch)
    action_dist = dist_class(logits, model)
    return -(action_dist.logp(train_batch[SampleBatch.ACTIONS]) * train_batch[Postprocessing.ADVANTAGES]).mean()


def stats(policy, train_batch):
    return {"advantage_mean": train_batch[Postprocessing.ADVANTAGES].mean()}


ClassicPGPolicy = build_torch_policy(name="ClassicPGPolicy", loss_fn=advantage_loss,
                                     postprocess_fn=postprocess_advantages, stats_fn=stats,
                                     get_default_config=lambda: {"gamma": 0.99, "lr": 0.01, "advantage_scale": 1.0})
ClassicPGTrainer = build_trainer(name="ClassicPGTrainer", default_policy=ClassicPGPolicy)
