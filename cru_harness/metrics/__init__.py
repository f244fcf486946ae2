"""Pure metric functions: per-item numbers or texts in, numbers out - the public re-scoring API.

Everything here works on plain Python / numpy values, so results produced by other tools (TOFU's or RWKU's own
scripts, open-unlearning, lm-eval ``--log_samples``) can be re-scored exactly as this harness scores them.
Definitions: ``shared/docs/protocol.md``; each function's docstring names the reference code it matches.
Bad input (empty arrays, mismatched lengths, NaN where a number is needed, a log-probability > 0) raises
``ValueError`` / ``TypeError`` / ``KeyError`` with a message naming the argument.

ROUGE (``rouge.py``)
    ``rouge_l_recall_tofu(prediction, target) -> float``   rouge_score rougeL recall, stemmed, lowercased (TOFU)
    ``rouge_l_recall_rwku(prediction, target) -> float``   RWKU's ``rouge`` 1.0.1 summary-level ROUGE-L recall:
                                                           case-sensitive, unstemmed, "NOANSWER" for blanks
    ``rouge1_recall(prediction, target) -> float``         rouge_score rouge1 recall, stemmed (TOFU / LUNAR)
    ``deviation_score(r1_forget, r1_retain) -> float``     LUNAR: ``100*sqrt(r1_forget^2 + (1-r1_retain)^2)``

TOFU likelihood metrics and aggregates (``tofu.py``); NLLs are per-token averages including EOS
    ``avg_nll(token_logprobs) -> float``
    ``probability_from_avg_nll(avg_nll) -> float | ndarray``            ``exp(-avg_nll)``
    ``mc_probability(avg_nll_true, avg_nlls_perturbed, *, epsilon=0)`` ``p_true / (p_true + sum p_perturbed + eps)``
    ``truth_ratio(avg_nll_paraphrased, avg_nlls_perturbed, *, epsilon=0)`` ``R = P_wrong / (P_right + eps)``
    ``truth_ratio_forget(R, *, epsilon=0) -> float``                   ``mean(min(R, 1/(R + eps)))``
    (``epsilon``: 0 for TOFU, ``OPEN_UNLEARNING_EPSILON`` = 1e-10 for open-unlearning)
    ``truth_ratio_utility(R) -> float``                                ``mean(max(0, 1 - R))``
    ``forget_quality(R_model, R_retain_model) -> float``               ``ks_2samp`` p-value
    ``model_utility({key: value for key in MODEL_UTILITY_KEYS})``      ``scipy.stats.hmean`` of the 9 numbers

Membership inference (``mia.py``; larger score = more member-like, RWKU's sign)
    ``loss_score(token_logprobs)``, ``zlib_score(text, avg_loglik)``, ``min_k(token_logprobs, k=0.2)``,
    ``min_k_plus_plus(token_logprobs, mu, sigma, k=0.2)``, ``mia_auc(member_scores, nonmember_scores)``
    (0.5 = chance, 1.0 = members all score higher).

Privacy and memorization as open-unlearning scores them (``privacy.py``; its sign: larger score = *less*
member-like, AUC labels forget 0 / holdout 1, so 1.0 = the forget set is recognised, 0.5 = chance)
    ``loss_attack(token_logprobs)``, ``zlib_attack(token_logprobs, text)``, ``reference_attack(lp, ref_lp)``
    (EOS included); ``min_k_attack(lp, k=0.4)``, ``min_k_plus_plus_attack(lp, mu, sigma, k=0.4)``,
    ``gradnorm_attack(parameter_grad_norms)``, ``exact_memorization(token_is_greedy)``,
    ``extraction_strength(token_is_greedy)`` (EOS left out: ``without_eos``); ``forget_holdout_auc(forget,
    holdout)``, ``privleak(auc_unlearned, auc_retain)`` (percent, 0 = the retain model's).

Fluency (``fluency.py``)
    ``ngram_entropy(text, n)``, ``fluency_entropy(text)`` (RWKU: ``mean(2/3*H2, 4/3*H3)``, bits),
    ``mean_fluency_entropy(texts)``, ``normalized_fluency_entropy(text)``, ``word_tokenize(text)``.

Short answers (``qa.py``)
    ``token_f1(prediction, answers)`` (TriviaQA F1, max over aliases), ``exact_match(prediction, answers)``,
    ``extract_bbh_answer(output)``, ``normalize_answer(text)``.

Failure classes (``failure.py``)
    ``classify_answer(answer, reference=None, *, rouge_recall=None, nll_under_original=None,
    refusal_phrases=DEFAULT_REFUSAL_PHRASES, scorer=rouge_l_recall_tofu) -> str`` and
    ``class_fractions(classes) -> dict``; thresholds ``CORRECT_ROUGE_THRESHOLD`` (0.5),
    ``DEGENERATE_NLL_THRESHOLD`` (3.0), ``DEGENERATE_MIN_WORDS`` (6), ``DEGENERATE_ENTROPY_THRESHOLD`` (0.9).
"""
from .failure import (
    ANSWER_CLASSES,
    CORRECT,
    CORRECT_ROUGE_THRESHOLD,
    DEFAULT_REFUSAL_PHRASES,
    DEGENERATE,
    DEGENERATE_ENTROPY_THRESHOLD,
    DEGENERATE_MIN_WORDS,
    DEGENERATE_NLL_THRESHOLD,
    REFUSAL,
    WRONG,
    class_fractions,
    classify_answer,
    is_degenerate,
    is_refusal,
)
from .fluency import (
    FLUENCY_NS,
    FLUENCY_WEIGHTS,
    fluency_entropy,
    mean_fluency_entropy,
    ngram_entropy,
    normalized_fluency_entropy,
    word_tokenize,
)
from .mia import MIN_K_RATIO, MIN_SIGMA, loss_score, mia_auc, min_k, min_k_plus_plus, zlib_score
from .privacy import (
    GRADNORM_P,
    OPEN_UNLEARNING_MIN_K,
    PRIVLEAK_DEFAULT_RETAIN_AUC,
    exact_memorization,
    extraction_strength,
    forget_holdout_auc,
    gradnorm_attack,
    loss_attack,
    min_k_attack,
    min_k_plus_plus_attack,
    privleak,
    reference_attack,
    without_eos,
    zlib_attack,
)
from .qa import exact_match, exact_match_rwku_bbh, extract_bbh_answer, normalize_answer, token_f1
from .rouge import NOANSWER, deviation_score, rouge1_recall, rouge_l_recall_rwku, rouge_l_recall_tofu
from .tofu import (
    MODEL_UTILITY_KEYS,
    MU_PROB_REAL_AUTHORS,
    MU_PROB_RETAIN,
    MU_PROB_WORLD_FACTS,
    MU_ROUGE_REAL_AUTHORS,
    MU_ROUGE_RETAIN,
    MU_ROUGE_WORLD_FACTS,
    MU_TRUTH_RATIO_REAL_AUTHORS,
    MU_TRUTH_RATIO_RETAIN,
    MU_TRUTH_RATIO_WORLD_FACTS,
    OPEN_UNLEARNING_EPSILON,
    avg_nll,
    forget_quality,
    mc_probability,
    model_utility,
    probability_from_avg_nll,
    truth_ratio,
    truth_ratio_forget,
    truth_ratio_utility,
)

__all__ = [
    # rouge
    "NOANSWER", "rouge_l_recall_tofu", "rouge_l_recall_rwku", "rouge1_recall", "deviation_score",
    # tofu
    "avg_nll", "probability_from_avg_nll", "mc_probability", "truth_ratio", "truth_ratio_forget",
    "truth_ratio_utility", "forget_quality", "model_utility", "MODEL_UTILITY_KEYS", "OPEN_UNLEARNING_EPSILON",
    "MU_ROUGE_RETAIN", "MU_PROB_RETAIN", "MU_TRUTH_RATIO_RETAIN",
    "MU_ROUGE_REAL_AUTHORS", "MU_PROB_REAL_AUTHORS", "MU_TRUTH_RATIO_REAL_AUTHORS",
    "MU_ROUGE_WORLD_FACTS", "MU_PROB_WORLD_FACTS", "MU_TRUTH_RATIO_WORLD_FACTS",
    # mia
    "loss_score", "zlib_score", "min_k", "min_k_plus_plus", "mia_auc", "MIN_K_RATIO", "MIN_SIGMA",
    # privacy (open-unlearning)
    "loss_attack", "zlib_attack", "min_k_attack", "min_k_plus_plus_attack", "reference_attack", "gradnorm_attack",
    "forget_holdout_auc", "privleak", "exact_memorization", "extraction_strength", "without_eos",
    "OPEN_UNLEARNING_MIN_K", "GRADNORM_P", "PRIVLEAK_DEFAULT_RETAIN_AUC",
    # fluency
    "ngram_entropy", "fluency_entropy", "mean_fluency_entropy", "normalized_fluency_entropy", "word_tokenize",
    "FLUENCY_NS", "FLUENCY_WEIGHTS",
    # qa
    "token_f1", "exact_match", "exact_match_rwku_bbh", "extract_bbh_answer", "normalize_answer",
    # failure
    "classify_answer", "class_fractions", "is_refusal", "is_degenerate", "ANSWER_CLASSES",
    "CORRECT", "REFUSAL", "DEGENERATE", "WRONG", "CORRECT_ROUGE_THRESHOLD", "DEGENERATE_NLL_THRESHOLD",
    "DEGENERATE_MIN_WORDS", "DEGENERATE_ENTROPY_THRESHOLD", "DEFAULT_REFUSAL_PHRASES",
]
