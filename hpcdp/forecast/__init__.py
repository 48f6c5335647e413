"""`hpcdp forecast`: from one campaign to the scale a user will train on.

For each strategy and precision the campaign ran, the step time at N nodes is

    step(N) = compute + straggler(N) + exposed(N)
    exposed(N) = max(0, comm(N) - window) + slowdown x min(comm(N), window)

- compute: measured in the campaign (per rank, at its batch per rank): the cell's median step
  time less its measured exposed communication. Weak scaling keeps it; strong scaling (global
  batch fixed) scales it with the micro-steps each rank still runs (flagged where that leaves the
  measured range).
- straggler(N): every rank waits for the slowest. Each rank's own work per step is recorded
  (the step record's `rank_work_s`); its spread sd about the step's mean makes the slowest of
  N ranks sd x E[max of N standard normals] above the mean, a term that grows with N (0.56 sd
  at 2 ranks, 1.42 at 8, 3.25 at 1024). The fit's step already holds its own ranks' share, so
  straggler(N) = sd x compute x (E[max of N] - E[max of the fit's ranks]).
- comm(N): the collectives the strategy issues per optimizer step (`plan`), each costing, as
  NCCL's ring model does (src/graph/tuning.cc; nccl-tests doc/PERFORMANCE.md for the factors):

      latency = (steps - inter_steps) x intra_lat + inter_steps x inter_lat
      time    = calls x latency + bytes x factor(n) / busbw

  steps 2(n-1) for all-reduce and n-1 for all-gather and reduce-scatter, inter_steps 2(nodes-1)
  and nodes-1; factor 2(n-1)/n and (n-1)/n. busbw is the inter-node figure once the ring leaves
  the node, else the intra-node one. An NCCL all-reduce across nodes takes the tree instead
  where NCCL's model finds it faster (small messages, many nodes): latency
  2((ranks per node - 1) x intra_lat + log2(nodes) x inter_lat), bytes x 2 / (0.9 busbw). The
  latency part of every term is shown apart (`latency_s`).
- window: the compute that runs while the collectives are in flight (backward for the gradient
  all-reduce; forward and backward for FSDP's gathers), from the campaign's phases. Where the
  campaign measured communication that compute did not hide, the hidden part (comm - exposed)
  is the window instead: what was measured hidden stays hidden, and no more.
- slowdown: on a GPU, compute beside a collective runs 18.9% slower (its kernels take SMs and
  memory bandwidth: Lee et al. 2025, measured on A100, H100, MI250, MI210), so hiding a
  collective costs that share of the time it hid; 0 on a CPU, where nothing runs beside compute.
- The network (alpha per ring step, busbw; intra- and inter-node apart) is fitted to the
  campaign's all-reduce probes (every size of their sweep, start and end), or read from the
  target profile's `network:` section.

Memory per rank: parameters, gradients and AdamW state as each strategy shards them (computed
from the model's tensor shapes: FSDP's dim-0 chunks, ZeRO-1's greedy partition, as torch does
them), plus what the campaign measured beyond the state (activations, buffers). Time, GPU-hours
and billing to train `tokens` follow from tokens/s. Every figure carries an interval (the
repeats' spread, the probe fit's residuals and drift) and says where it extrapolates.

The package: model.py (pure: state, network costs, Comm, the split of a measured step),
inputs.py (network figures, one Fit per strategy from the run folders), predict.py (one node
count), build.py (the whole, from a folder), report.py (text, JSON, plot, ranking),
published.py (published figures), memory.py (the pre-queue memory check). No torch: the CLI
imports this.
"""

from __future__ import annotations

from hpcdp.forecast.build import (
                                  DEFAULT_NODES,
                                  TOKENS_PER_PARAM,
                                  Forecast,
                                  billing_rate,
                                  make,
                                  parse_nodes,
)
from hpcdp.forecast.inputs import (
                                  Fit,
                                  fit_network,
                                  fits_of,
                                  model_of,
                                  network_from_profile,
                                  network_warnings,
                                  rank_spread,
)
from hpcdp.forecast.memory import activation_bytes, experiment_shapes, memory_warnings
from hpcdp.forecast.model import (
                                  ADAM_STEP_BYTES,
                                  OVERLAP_SLOWDOWN,
                                  Comm,
                                  Model,
                                  Network,
                                  _last_bucket,
                                  comm_s,
                                  comm_terms,
                                  expected_max_normal,
                                  gpt2_shapes,
                                  latency_s,
                                  split_step,
                                  state_bytes,
                                  straggler_s,
)
from hpcdp.forecast.predict import ONE_RUN, Prediction, predict
from hpcdp.forecast.published import (
                                  known_error_per_doubling,
                                  published_checks,
                                  series_checks,
                                  series_scale_table,
                                  series_set_aside,
                                  series_summary,
                                  series_table,
)
from hpcdp.forecast.report import as_json, plot, ranking, ranking_line, render_text, rows

__all__ = ["ADAM_STEP_BYTES", "DEFAULT_NODES", "ONE_RUN", "OVERLAP_SLOWDOWN", "TOKENS_PER_PARAM",
           "Comm", "Fit", "Forecast", "Model", "Network", "Prediction", "_last_bucket",
           "activation_bytes", "as_json", "billing_rate", "comm_s", "comm_terms",
           "expected_max_normal", "experiment_shapes", "fit_network", "fits_of",
           "gpt2_shapes", "known_error_per_doubling", "latency_s", "make", "memory_warnings",
           "model_of",
           "network_from_profile", "network_warnings", "parse_nodes", "plot", "predict",
           "published_checks", "rank_spread", "ranking", "ranking_line", "render_text", "rows",
           "series_checks", "series_scale_table", "series_set_aside", "series_summary",
           "series_table", "split_step", "state_bytes", "straggler_s"]
