"""The built-in schemes: the module that builds each, and its one-line description.

Importable without torch, so that `dpfl schemes` lists the schemes without loading any implementation,
and building a scheme imports only its own module. `registry.register` refuses a builder whose name
or module is not listed here."""

from __future__ import annotations

_BY_MODULE: dict[str, dict[str, str]] = {
    "dpfl.schemes.registry": {
        "fl-std": ("FL-STD (thesis §2.1): local SGD, data-size-weighted mean of updates (FedAvg); secure = true: "
                   "updates clipped to clip, secure sum (fixed point), mean, no client-level noise"),
        "fedavg": "FedAvg (McMahan et al.), same as fl-std (secure = true likewise)",
        "fedsgd": "FedSGD: one full-batch gradient per client, server step η·weighted mean",
    },
    "dpfl.schemes.catalog": {
        "fl-sign": "FL-SIGN (Alg. 3): 1-bit sign updates, γ·sign of the unweighted majority vote",
        "signsgd": "signSGD (Bernstein et al.): all clients, one mini-batch, majority vote, 1-bit downstream",
        "fl-cs": "FL-CS (Alg. 4): chunked DCT compression; BPDN with momentum and error feedback",
        "fl-rnd": "FL-RND (Alg. 5): a fresh seed-shared random m-subset each round",
        "fl-freq": "FL-FREQ (Alg. 6): first m DCT coefficients, inverse DCT (low-pass), no BPDN",
        "fl-top": "FL-TOP (Alg. 7–8): Top-K set from public data, Top-K SGD, K values both ways",
        "fl-basic": "FL-BASIC (§4.2.2): a random trainable K-subset re-selected each round, full model down",
    },
    "dpfl.schemes.catalog_dp": {
        "fl-std-dp": "FL-STD-DP (thesis Alg. 10): clip to S, Gaussian noise shares, secure sum, mean",
        "fl-cs-dp": ("FL-CS-DP (Alg. 11): DCT compress, clip, noise, secure sum; BPDN with momentum and "
                     "error feedback on the server"),
        "fl-rnd-dp": "FL-RND-DP (Alg. 12): a fresh shared random m-subset, clip, noise, secure sum",
        "fl-freq-dp": "FL-FREQ-DP (Alg. 13): first m DCT coefficients, clip, noise, secure sum, low-pass",
        "fl-top-dp": "FL-TOP-DP (Alg. 14): Top-K set from public data, Top-K SGD, clip, noise, secure sum",
        "fl-basic-dp": "FL-BASIC-DP (§5.4.5): a fresh random trainable K-subset each round, clip, noise",
        "fl-sign-dp": ("FL-SIGN-DP (Alg. 9): z ~ DG(sign(Δw), √n·σ/√(|K|−l)), secure sum over Z_2^b, γ·sign "
                       "of the sum"),
    },
    "dpfl.schemes.catalog_qsgd": {
        "qsgd": "QSGD (Alistarh et al. 2017): stochastic s-level quantization per bucket, weighted mean",
        "qsgd-dp": "QSGD-DP: clip, Gaussian noise (local, or central at a trusted server), QSGD on the wire",
    },
    "dpfl.schemes.catalog_fl": {
        "fedprox": "FedProx (Li et al.): FL-STD with the proximal term mu/2·‖w − w_t‖² in local training",
        "fsvrg": "FSVRG (Konečný et al.): round-start full gradient, one SVRG pass per client, step h/n_k",
        "feddyn": ("FedDyn (Acar et al.): stateful clients with a dynamic regulariser alpha, server h "
                   "correction"),
        "sub-fedavg": ("Sub-FedAvg (Vahidian et al.), unstructured: personal masks by magnitude pruning, "
                       "averaged on the intersection"),
    },
}

SCHEMES: dict[str, tuple[str, str]] = {name: (module, desc) for module, names in _BY_MODULE.items()
                                       for name, desc in names.items()}


# the schemes whose steps add privacy events (the run keeps a client-level ε ledger)
PRIVATE: frozenset[str] = frozenset(_BY_MODULE["dpfl.schemes.catalog_dp"]) | {"qsgd-dp"}


def list_schemes() -> dict[str, str]:
    """Scheme name -> description, sorted by name."""
    return {name: desc for name, (_, desc) in sorted(SCHEMES.items())}
