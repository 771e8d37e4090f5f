"""Step-time regressors as in AdaptiveLLM 3.2: eight scikit-learn regressors x polynomial
features of degree 1..5 on (layers, hidden size, tokens per request, batch size), compared
by mean absolute percentage error on held-out measurements (Tables 5-6); the best is kept in
the portable form of simulator/costmodel/regression.py.

Features and target are taken in logarithms (then standardised and expanded into monomials):
step time is close to a product of powers of the four features, which a low-degree
polynomial in logs follows far better than one in raw values. The table reports the error
of the time itself, as the paper does."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
from rich.table import Table
from scipy.optimize import nnls
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from sklearn.linear_model import ElasticNet, Lasso, LinearRegression, Ridge
from sklearn.neighbors import KNeighborsRegressor
from sklearn.tree import DecisionTreeRegressor

from infersim.simulator.costmodel.regression import (
    FEATURES,
    REGRESSOR_FORMAT,
    REGRESSOR_VERSION,
    PortableRegressor,
    design_matrix,
    pack_array,
    poly_powers,
)

DEGREES = (1, 2, 3, 4, 5)
# name -> (AdaptiveLLM's row label, what it is)
REGRESSORS = {
    "linear": "linear regression",
    "decision_tree": "decision tree",
    "random_forest": "random forest",
    "ridge": "ridge regression",
    "lasso": "lasso regression",
    "elastic_net": "elastic net",
    "gradient_boosting": "gradient boosting",
    "knn": "k-nearest neighbours",
}


def make_regressor(name: str, seed: int = 0):
    return {
        "linear": lambda: LinearRegression(),
        "decision_tree": lambda: DecisionTreeRegressor(random_state=seed),
        "random_forest": lambda: RandomForestRegressor(n_estimators=50, random_state=seed),
        "ridge": lambda: Ridge(alpha=1e-2),
        "lasso": lambda: Lasso(alpha=1e-4, max_iter=20000),
        "elastic_net": lambda: ElasticNet(alpha=1e-4, l1_ratio=0.5, max_iter=20000),
        "gradient_boosting": lambda: GradientBoostingRegressor(random_state=seed),
        "knn": lambda: KNeighborsRegressor(n_neighbors=5, algorithm="brute"),
    }[name]()


def mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100.0)


@dataclass(frozen=True)
class Candidates:
    """The predictors a comparison fits: every regressor at every polynomial degree
    (AdaptiveLLM's Tables 5-6), with the seed of their randomness (trees, forests, splits)."""

    degrees: tuple[int, ...] = field(default=DEGREES, metadata={"help": "polynomial degrees of the feature expansion"})
    regressors: tuple[str, ...] = field(
        default=tuple(REGRESSORS), metadata={"help": "regressor names, keys of REGRESSORS"}
    )
    seed: int = field(default=0, metadata={"help": "random state of the regressors and of the data splits"})


@dataclass(frozen=True)
class FitRecord:
    """What a stored regressor says about its fit: what it predicts from which features, and
    its error on the rows it was not fitted on."""

    target: str = field(metadata={"help": "what is predicted: prefill, decode, ..."})
    mape: float = field(metadata={"help": "held-out mean absolute percentage error (%)"})
    n_train: int = field(metadata={"help": "rows it was fitted on"})
    n_test: int = field(metadata={"help": "held-out rows the error is measured on"})
    features: tuple[str, ...] = field(default=FEATURES, metadata={"help": "input feature names, in order"})


@dataclass
class Comparison:
    target: str
    table: dict[str, dict[int, float]]  # regressor -> degree -> held-out MAPE %
    best: tuple[str, int]
    n_train: int
    n_test: int
    portable: dict = field(repr=False, default_factory=dict)
    train_mape: float = 0.0
    conversion_max_rel: float = 0.0  # portable vs scikit-learn on the held-out rows

    @property
    def best_mape(self) -> float:
        return self.table[self.best[0]][self.best[1]]

    def as_dict(self) -> dict:
        return {
            "target": self.target,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "best": {"estimator": self.best[0], "degree": self.best[1], "mape": round(self.best_mape, 4)},
            "conversion_max_rel": self.conversion_max_rel,
            "table": {k: {str(d): round(v, 4) for d, v in row.items()} for k, row in self.table.items()},
        }


def split(n: int, test_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    n_test = max(1, int(round(n * test_frac)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def transform_for(X_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    Z = np.log(X_train)
    mean = Z.mean(axis=0)
    scale = Z.std(axis=0)
    scale[scale == 0] = 1.0
    return mean, scale


def compare(
    X: np.ndarray,
    y: np.ndarray,
    *,
    target: str,
    candidates: Candidates = Candidates(),
    test_frac: float = 0.2,
    progress=None,
) -> Comparison:
    """Fit every regressor at every degree on the training rows, score on the held-out rows,
    keep the best (lowest held-out MAPE; the first in table order on a tie)."""
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    degrees, regressors, seed = candidates.degrees, candidates.regressors, candidates.seed
    tr, te = split(len(y), test_frac, seed)
    mean, scale = transform_for(X[tr])
    table: dict[str, dict[int, float]] = {name: {} for name in regressors}
    best, best_err, best_fit = None, np.inf, None
    for deg in degrees:
        powers = poly_powers(X.shape[1], deg)
        D = design_matrix(X, mean, scale, powers)
        for name in regressors:
            est = make_regressor(name, seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(D[tr], np.log(y[tr]))
                pred = np.exp(est.predict(D[te]))
            err = mape(pred, y[te])
            table[name][deg] = err if np.isfinite(err) else float("inf")
            if table[name][deg] < best_err:
                best, best_err, best_fit = (name, deg), table[name][deg], (est, powers, pred)
            if progress:
                progress(f"regress {target} {name} deg {deg}")
    est, powers, sk_pred = best_fit
    spec = to_portable(best[0], best[1], est, mean, scale, powers, FitRecord(target, best_err, len(tr), len(te)))
    port = PortableRegressor(spec)
    conv = float(np.max(np.abs(port.predict(X[te]) - sk_pred) / sk_pred))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_err = mape(port.predict(X[tr]), y[tr])
    return Comparison(target, table, best, len(tr), len(te), spec, train_err, conv)


# ---- scikit-learn estimator -> plain arrays -----------------------------------------------------------
def _tree_dict(tree) -> dict:
    t = tree.tree_
    return {
        "left": pack_array(t.children_left.astype(np.int32)),
        "right": pack_array(t.children_right.astype(np.int32)),
        "feature": pack_array(t.feature.astype(np.int32)),
        "threshold": pack_array(t.threshold.astype(np.float64)),
        "value": pack_array(t.value.reshape(t.node_count, -1)[:, 0].astype(np.float64)),
    }


def to_portable(name: str, degree: int, est, mean, scale, powers, record: FitRecord) -> dict:
    """A fitted scikit-learn estimator (on features standardised by mean and scale, expanded
    into the monomials `powers`) as plain arrays that simulator/costmodel/regression.py reads."""
    if name in ("linear", "ridge", "lasso", "elastic_net"):
        kind, model = (
            "linear",
            {
                "coef": pack_array(np.asarray(est.coef_, dtype=np.float64).reshape(-1)),
                "intercept": float(np.asarray(est.intercept_).reshape(-1)[0]),
            },
        )
    elif name == "decision_tree":
        kind, model = "tree", {"trees": [_tree_dict(est)]}
    elif name == "random_forest":
        kind, model = "forest", {"trees": [_tree_dict(t) for t in est.estimators_]}
    elif name == "gradient_boosting":
        init = float(np.asarray(est.init_.constant_).reshape(-1)[0])
        kind, model = (
            "boosting",
            {
                "init": init,
                "learning_rate": float(est.learning_rate),
                "trees": [_tree_dict(t) for t in est.estimators_[:, 0]],
            },
        )
    elif name == "knn":
        if est.weights != "uniform":
            raise ValueError("only uniform k-NN weights are stored")
        kind, model = (
            "knn",
            {
                "X": pack_array(np.asarray(est._fit_X, dtype=np.float64)),
                "y": pack_array(np.asarray(est._y, dtype=np.float64).reshape(-1)),
                "k": int(est.n_neighbors),
            },
        )
    else:
        raise ValueError(f"unknown regressor {name}")
    transform = {
        "log_features": True,
        "log_target": True,
        "mean": [float(v) for v in mean],
        "scale": [float(v) for v in scale],
    }
    return _portable(record, name, degree, kind, transform=transform, powers=np.asarray(powers).tolist(), model=model)


def _portable(record: FitRecord, estimator: str, degree: int, kind: str, **body) -> dict:
    """The stored form's header, the estimator's own `body` fields, the fit's record."""
    return {
        "format": REGRESSOR_FORMAT,
        "version": REGRESSOR_VERSION,
        "target": record.target,
        "estimator": estimator,
        "degree": int(degree),
        "features": list(record.features),
        "kind": kind,
        **body,
        "held_out": {
            "mape": round(float(record.mape), 4),
            "n_train": int(record.n_train),
            "n_test": int(record.n_test),
        },
    }


# ---- printing -----------------------------------------------------------------------------------------
def error_table(comp: Comparison, title: str | None = None):
    """A rich Table laid out like AdaptiveLLM Tables 5-6: regressor x degree, MAPE %."""
    degs = sorted({d for row in comp.table.values() for d in row})
    t = Table(
        title=title
        or f"{comp.target} step time: held-out MAPE (%) by regressor and polynomial degree "
        f"({comp.n_train} train / {comp.n_test} held-out)"
    )
    t.add_column("regressor - degree")
    for d in degs:
        t.add_column(str(d), justify="right")
    for name, row in comp.table.items():
        cells = []
        for d in degs:
            v = row.get(d, float("nan"))
            s = f"{v:.2f}" if v < 1e4 else f"{v:.3g}"
            cells.append(f"[bold green]{s}[/]" if (name, d) == comp.best else s)
        t.add_row(REGRESSORS.get(name, name), *cells)
    t.caption = f"best: {REGRESSORS.get(comp.best[0], comp.best[0])}, degree {comp.best[1]}: {comp.best_mape:.2f}%"
    return t


# ---- per-model recompute predictors: fitted and held-out sets given ---------------------------------
PHYSICAL = "affine_quadratic"  # the physical candidate's row name


def fit_physical(X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """time = c0 + c . x with every coefficient >= 0, least squares in relative error. With
    x = (tokens, batch, sum of squared prompt lengths) this is the cost of a prefill: a fixed
    per-iteration cost, per-token work (projections, MLP), per-sequence work (attention calls,
    LM head row) and attention's score matrix, quadratic in each prompt's length."""
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    A = np.column_stack([np.ones(len(y)), X]) / y[:, None]
    colscale = np.abs(A).max(axis=0)
    colscale[colscale == 0] = 1.0
    coef, _ = nnls(A / colscale, np.ones(len(y)))
    coef = coef / colscale
    return float(coef[0]), coef[1:]


def physical_portable(intercept: float, coef: np.ndarray, record: FitRecord) -> dict:
    return _portable(
        record,
        PHYSICAL,
        2,
        "physical",
        model={"coef": pack_array(np.asarray(coef, dtype=np.float64)), "intercept": float(intercept)},
    )


def _fit_one(name: str, deg, X, y, mean, scale, seed):
    """(predict function, fitted thing) of one candidate on (X, y)."""
    if name == PHYSICAL:
        c0, c = fit_physical(X, y)
        return (lambda Z: Z @ c + c0), (c0, c)
    powers = poly_powers(X.shape[1], deg)
    est = make_regressor(name, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(design_matrix(X, mean, scale, powers), np.log(y))

    def pred(Z, est=est, powers=powers):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.exp(est.predict(design_matrix(Z, mean, scale, powers)))

    return pred, (est, powers)


def compare_sets(
    X_fit,
    y_fit,
    X_held,
    y_held,
    *,
    target: str,
    features,
    candidates: Candidates = Candidates(),
    folds: int = 5,
) -> dict:
    """Every regressor x degree (AdaptiveLLM's table) and the physical model, fitted on the
    fitted set and scored on the held-out set. The kept candidate is chosen WITHOUT looking at
    the held-out set: by its mean error over a seeded `folds`-fold cross-validation of the
    fitted set, then refitted on the whole fitted set; so its held-out error is an honest
    estimate. The candidate the held-out set itself would have picked (what the paper's
    tables report) is returned beside it."""
    X_fit, y_fit = np.asarray(X_fit, dtype=np.float64), np.asarray(y_fit, dtype=np.float64)
    X_held, y_held = np.asarray(X_held, dtype=np.float64), np.asarray(y_held, dtype=np.float64)
    degrees, regressors, seed = candidates.degrees, candidates.regressors, candidates.seed
    perm = np.random.default_rng(seed).permutation(len(y_fit))
    parts = [np.sort(perm[k::folds]) for k in range(folds)]
    mean_all, scale_all = transform_for(X_fit)
    cands = [(PHYSICAL, 2)] + [(n, d) for d in degrees for n in regressors]
    table: dict[str, dict[int, float]] = {PHYSICAL: {}}
    table.update({n: {} for n in regressors})
    validation: dict[str, dict[int, float]] = {k: {} for k in table}
    fits = {}
    for name, deg in cands:
        errs = []
        for va in parts:
            tr = np.setdiff1d(np.arange(len(y_fit)), va)
            mean_tr, scale_tr = transform_for(X_fit[tr])
            pv, _ = _fit_one(name, deg, X_fit[tr], y_fit[tr], mean_tr, scale_tr, seed)
            errs.append(mape(pv(X_fit[va]), y_fit[va]))
        ev = float(np.mean(errs))
        validation[name][deg] = ev if np.isfinite(ev) else float("inf")
        ph, fitted = _fit_one(name, deg, X_fit, y_fit, mean_all, scale_all, seed)
        eh = mape(ph(X_held), y_held)
        table[name][deg] = eh if np.isfinite(eh) else float("inf")
        fits[(name, deg)] = (ph, fitted)
    chosen = min(cands, key=lambda c: (validation[c[0]][c[1]], cands.index(c)))
    oracle = min(cands, key=lambda c: (table[c[0]][c[1]], cands.index(c)))
    ph, fitted = fits[chosen]
    name, deg = chosen
    record = FitRecord(target, table[name][deg], len(y_fit), len(y_held), tuple(features))
    if name == PHYSICAL:
        spec = physical_portable(fitted[0], fitted[1], record)
    else:
        est, powers = fitted
        spec = to_portable(name, deg, est, mean_all, scale_all, powers, record)
    port = PortableRegressor(spec)
    conv = float(np.max(np.abs(port.predict(X_held) - ph(X_held)) / ph(X_held)))
    return {
        "portable": spec,
        "chosen": {
            "estimator": name,
            "degree": int(deg),
            "held_out_mape": table[name][deg],
            "validation_mape": validation[name][deg],
        },
        "oracle": {"estimator": oracle[0], "degree": int(oracle[1]), "held_out_mape": table[oracle[0]][oracle[1]]},
        "conversion_max_rel": conv,
        "n_fit": len(y_fit),
        "n_held_out": len(y_held),
        "table": {k: {str(d): round(v, 4) for d, v in row.items()} for k, row in table.items()},
        "validation_table": {k: {str(d): round(v, 4) for d, v in row.items()} for k, row in validation.items()},
    }
