"""Metric functions against hand-computed values (worked in the comments, never by calling the function).

Cross-checks against the reference packages (`rouge` 1.0.1, scikit-learn, nltk): the test extra installs them
(they are not dependencies of the package), and a missing one fails its test rather than skipping it.
"""
import math
import random
import warnings
import zlib

import numpy as np
import pytest

import cru_harness.metrics as M

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------- ROUGE

def test_rouge_case_tofu_lowercases_rwku_does_not():
    # TOFU: rouge_score lowercases -> "paris" == "paris": recall 1/1. RWKU: "paris" != "Paris": 0/1.
    assert M.rouge_l_recall_tofu("paris", "Paris") == pytest.approx(1.0)
    assert M.rouge_l_recall_rwku("paris", "Paris") == 0.0


def test_rouge_stemming_and_punctuation():
    # target "He wrote novel", prediction "He writes novels".
    # TOFU (Porter): target [he, wrote, novel], prediction [he, write, novel] -> LCS he, novel = 2/3.
    # RWKU: words He/wrote/novel vs He/writes/novels -> only "He" -> 1/3.
    assert M.rouge_l_recall_tofu("He writes novels", "He wrote novel") == pytest.approx(2 / 3)
    assert M.rouge_l_recall_rwku("He writes novels", "He wrote novel") == pytest.approx(1 / 3)
    # RWKU keeps punctuation on the word: "Paris," != "Paris" -> 0; TOFU drops it -> 1.
    assert M.rouge_l_recall_rwku("Paris, France", "Paris") == 0.0
    assert M.rouge_l_recall_tofu("Paris, France", "Paris") == pytest.approx(1.0)


def test_rouge_summary_level_lcs_over_sentences():
    # target "A B C. D E" -> RWKU sentences [A B C], [D E]; distinct reference words {A,B,C,D,E} = 5.
    # prediction "D E A. B" -> sentences [D E A], [B].
    # LCS([A B C],[D E A]) = {A}; LCS([A B C],[B]) = {B}; LCS([D E],[D E A]) = {D,E}; LCS([D E],[B]) = {}.
    # union {A,B,D,E} -> 4/5.
    assert M.rouge_l_recall_rwku("D E A. B", "A B C. D E") == pytest.approx(0.8)
    # TOFU: one token sequence each, [a b c d e] vs [d e a b]: LCS length 2 ("a b" or "d e") -> 2/5.
    assert M.rouge_l_recall_tofu("D E A. B", "A B C. D E") == pytest.approx(0.4)


def test_rouge_rwku_counts_distinct_words():
    # RWKU (exclusive mode): reference "the cat the dog" -> distinct {the, cat, dog} = 3; LCS with "the dog"
    # = {the, dog} -> 2/3. TOFU counts tokens: LCS 2 of 4 reference tokens -> 1/2.
    assert M.rouge_l_recall_rwku("the dog", "the cat the dog") == pytest.approx(2 / 3)
    assert M.rouge_l_recall_tofu("the dog", "the cat the dog") == pytest.approx(0.5)


def test_rouge_rwku_noanswer_and_strip():
    # An empty / blank prediction is scored as "NOANSWER": against "NOANSWER is here" (3 distinct words) -> 1/3.
    assert M.rouge_l_recall_rwku("", "NOANSWER is here") == pytest.approx(1 / 3)
    assert M.rouge_l_recall_rwku("  \n ", "NOANSWER is here") == pytest.approx(1 / 3)
    assert M.rouge_l_recall_rwku("", "Paris") == 0.0
    # The prediction is stripped first: "  Paris  " -> "Paris" -> 1/1.
    assert M.rouge_l_recall_rwku("  Paris  ", "Paris") == 1.0
    # Only dots: the package would raise; documented here as 0.0. An empty target is an error.
    assert M.rouge_l_recall_rwku("...", "Paris") == 0.0
    with pytest.raises(ValueError):
        M.rouge_l_recall_rwku("Paris", "")
    with pytest.raises(TypeError):
        M.rouge_l_recall_rwku(None, "Paris")


def test_rouge_rwku_matches_the_rouge_package():
    import rouge

    scorer = rouge.Rouge()
    vocab = ["a", "b", "c", "The", "the", "Paris", "Paris,", "x.", ".", " ", "e. f"]
    rng = random.Random(1)
    compared = 0
    for _ in range(2000):
        hyp = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 10)))
        ref = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 8)))
        pred = (hyp if hyp.strip() else "NOANSWER").strip()
        try:
            expected = scorer.get_scores([pred], [ref], avg=True)["rouge-l"]["r"]
        except (ValueError, ZeroDivisionError) as err:
            if str(err) == "Hypothesis is empty.":   # the documented deviation: a prediction of dots scores 0
                assert M.rouge_l_recall_rwku(hyp, ref) == 0.0, (hyp, ref)
            else:                                    # a target with no sentence: an error in both
                with pytest.raises(ValueError, match="target has no sentence"):
                    M.rouge_l_recall_rwku(hyp, ref)
            continue
        assert M.rouge_l_recall_rwku(hyp, ref) == pytest.approx(expected, abs=1e-12), (hyp, ref)
        compared += 1
    assert compared > 1900   # the reference scored nearly every pair: the comparison is not vacuous


def test_rouge1_and_deviation_score():
    # target "the cats sat" -> [the, cat, sat]; prediction "the cat" -> unigram overlap 2 -> 2/3.
    assert M.rouge1_recall("the cat", "the cats sat") == pytest.approx(2 / 3)
    # 100 * sqrt(0.3^2 + (1 - 0.6)^2) = 100 * sqrt(0.09 + 0.16) = 50.
    assert M.deviation_score(0.3, 0.6) == pytest.approx(50.0)
    assert M.deviation_score(0.0, 1.0) == 0.0
    with pytest.raises(ValueError):
        M.deviation_score(1.2, 0.5)
    with pytest.raises(ValueError):
        M.deviation_score(float("nan"), 0.5)


# ---------------------------------------------------------------------------------------------- TOFU

def test_probability_and_avg_nll_including_eos():
    assert M.probability_from_avg_nll(LN2) == pytest.approx(0.5)
    np.testing.assert_allclose(M.probability_from_avg_nll([0.0, LN2]), [1.0, 0.5])
    # Answer tokens log(1/2), log(1/2) and EOS log(1/8): avg NLL = (ln2 + ln2 + 3 ln2) / 3 = 5/3 ln2,
    # probability 2^(-5/3) = 0.314980; without EOS it would be 2^(-1) = 0.5.
    with_eos = M.avg_nll([-LN2, -LN2, -3 * LN2])
    assert with_eos == pytest.approx(5 / 3 * LN2)
    assert M.probability_from_avg_nll(with_eos) == pytest.approx(0.3149802625)
    assert M.probability_from_avg_nll(M.avg_nll([-LN2, -LN2])) == pytest.approx(0.5)


def test_mc_probability():
    # p_true = 1/2, perturbed 1/4 and 1/8: 0.5 / (0.5 + 0.25 + 0.125) = 4/7.
    assert M.mc_probability(LN2, [2 * LN2, 3 * LN2]) == pytest.approx(4 / 7)
    # Vectorised: items x perturbations. Second item: p_true = 1, perturbed 1, 1 -> 1/3.
    np.testing.assert_allclose(
        M.mc_probability([LN2, 0.0], [[2 * LN2, 3 * LN2], [0.0, 0.0]]), [4 / 7, 1 / 3])
    # Huge NLLs must not underflow to 0/0: p_true = e^-1000, perturbed e^-1001 -> 1 / (1 + e^-1) = 0.731059.
    assert M.mc_probability(1000.0, [1001.0]) == pytest.approx(1 / (1 + math.exp(-1)))


def test_mc_probability_depends_on_eos():
    # True answer: tokens log 1/2, log 1/2 + EOS log 1/8 -> p = 2^(-5/3) = 0.314980 (0.5 without EOS).
    # Perturbed: token log 1/4 + EOS log 1 -> p = e^(-ln4/2) = 0.5 (0.25 without EOS).
    # With EOS:   0.314980 / (0.314980 + 0.5)  = 0.386488.   Without: 0.5 / (0.5 + 0.25) = 2/3.
    with_eos = M.mc_probability(M.avg_nll([-LN2, -LN2, -3 * LN2]), [M.avg_nll([-2 * LN2, 0.0])])
    without = M.mc_probability(M.avg_nll([-LN2, -LN2]), [M.avg_nll([-2 * LN2])])
    assert with_eos == pytest.approx(0.3149802625 / 0.8149802625)
    assert without == pytest.approx(2 / 3)


def test_truth_ratio_and_both_aggregations():
    # Item 1: paraphrased NLL 1, perturbed 2 and 3 -> P_wrong = geometric mean e^-2.5, P_right = e^-1,
    #         R = e^-1.5 = 0.2231302 (an arithmetic mean of the probabilities would give 0.2516).
    # Item 2: paraphrased 2, perturbed 1, 1 -> R = e^1 = 2.7182818.
    r = M.truth_ratio([1.0, 2.0], [[2.0, 3.0], [1.0, 1.0]])
    np.testing.assert_allclose(r, [0.2231301601, 2.7182818285])
    assert M.truth_ratio(1.0, [2.0, 3.0]) == pytest.approx(0.2231301601)
    # Forget: mean(min(R, 1/R)) = (0.2231302 + 0.3678794) / 2 = 0.2955048.
    assert M.truth_ratio_forget(r) == pytest.approx(0.2955047923)
    # Utility: mean(max(0, 1 - R)) = (0.7768698 + 0) / 2 = 0.3884349.
    assert M.truth_ratio_utility(r) == pytest.approx(0.3884349199)
    # Edge values: R = 0 or inf contribute 0 to the forget aggregate; R = 0 contributes 1 to utility.
    assert M.truth_ratio_forget([0.0, math.inf, 1.0]) == pytest.approx(1 / 3)
    assert M.truth_ratio_utility([0.0, 1.0]) == pytest.approx(0.5)


def test_tofu_input_errors():
    with pytest.raises(ValueError, match="empty"):
        M.truth_ratio_forget([])
    with pytest.raises(ValueError, match="NaN"):
        M.truth_ratio_utility([0.5, float("nan")])
    with pytest.raises(ValueError, match="mismatch"):
        M.truth_ratio([1.0, 2.0], [[1.0, 2.0]] * 3)
    with pytest.raises(ValueError, match="one more axis"):
        M.mc_probability([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="negative"):
        M.probability_from_avg_nll(-0.1)
    with pytest.raises(ValueError, match="positive"):
        M.avg_nll([-0.1, 0.2])
    with pytest.raises(ValueError, match="empty|no perturbed"):
        M.truth_ratio([1.0], np.zeros((1, 0)))
    with pytest.raises(ValueError):
        M.truth_ratio_forget([-1.0])


def test_forget_quality_ks_pvalue_by_enumeration():
    # n = m = 2: the C(4,2) = 6 orderings of the pooled sample are equally likely under H0; D = 1 only for
    # xxyy and yyxx -> p = 2/6.
    assert M.forget_quality([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1 / 3)
    # n = m = 3 fully separated: 2 of C(6,3) = 20 orderings -> 0.1.
    assert M.forget_quality([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)
    # Interleaved [1,3] vs [2,4]: D = 1/2, and every one of the 6 orderings has D >= 1/2 -> p = 1.
    assert M.forget_quality([1.0, 3.0], [2.0, 4.0]) == pytest.approx(1.0)
    # TOFU feeds 1/R to the test; the p-value is the same for R and 1/R.
    a, b = np.array([0.2, 0.5, 0.9, 1.4]), np.array([0.3, 0.35, 2.0, 3.0, 4.0])
    assert M.forget_quality(a, b) == pytest.approx(M.forget_quality(1 / a, 1 / b))
    with pytest.raises(ValueError):
        M.forget_quality([], [1.0])


def _mu(values):
    return {k: v for k, v in zip(M.MODEL_UTILITY_KEYS, values)}


def test_model_utility_harmonic_mean():
    assert len(M.MODEL_UTILITY_KEYS) == 9 and len(set(M.MODEL_UTILITY_KEYS)) == 9
    # Six values 1/2 and three 1/4: 9 / (6*2 + 3*4) = 9/24 = 0.375.
    assert M.model_utility(_mu([0.5] * 6 + [0.25] * 3)) == pytest.approx(0.375)
    # A zero -> 0 (scipy's hmean convention, what TOFU gets).
    assert M.model_utility(_mu([0.5] * 8 + [0.0])) == 0.0
    with pytest.warns(RuntimeWarning, match="NaN"):
        assert math.isnan(M.model_utility(_mu([0.5] * 8 + [float("nan")])))


def test_model_utility_errors():
    values = _mu([0.5] * 9)
    del values[M.MU_TRUTH_RATIO_WORLD_FACTS]
    with pytest.raises(KeyError, match="Truth Ratio Real World"):
        M.model_utility(values)
    with pytest.raises(KeyError, match="unknown"):
        M.model_utility({**_mu([0.5] * 9), "ROUGE Forget": 0.1})
    with pytest.raises(ValueError, match="outside"):
        M.model_utility(_mu([0.5] * 8 + [1.5]))
    with pytest.raises(TypeError):
        M.model_utility([0.5] * 9)


# ---------------------------------------------------------------------------------------------- MIA

def test_loss_and_zlib():
    assert M.loss_score([-1.0, -2.0, -3.0]) == pytest.approx(-2.0)
    text = "the cat sat on the mat " * 5
    # Denominator: the zlib-compressed UTF-8 byte length (computed with zlib directly).
    assert M.zlib_score(text, -2.0) == pytest.approx(-2.0 / len(zlib.compress(text.encode("utf-8"))))
    # At equal length and LOSS, repetitive text compresses better -> smaller denominator -> more negative score.
    repetitive = "ab" * 50
    varied = "".join(chr(33 + (i * 37) % 90) for i in range(100))
    assert M.zlib_score(repetitive, -2.0) < M.zlib_score(varied, -2.0)
    with pytest.raises(ValueError):
        M.zlib_score(text, 0.5)


def test_min_k():
    lp = [-0.1, -5.0, -0.2, -3.0, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8]
    # k = 0.2 of 10 tokens -> the 2 lowest: -5, -3 -> -4.
    assert M.min_k(lp, k=0.2) == pytest.approx(-4.0)
    # k = 0.5 -> 5 lowest: -5, -3, -0.8, -0.7, -0.6 -> -10.1 / 5 = -2.02.
    assert M.min_k(lp, k=0.5) == pytest.approx(-2.02)
    # k = 1 -> the mean of all = -11.6 / 10.
    assert M.min_k(lp, k=1.0) == pytest.approx(-1.16)
    # 3 tokens, k = 0.2: int(0.6) = 0 -> at least one token kept: -5.
    assert M.min_k([-0.1, -5.0, -0.2], k=0.2) == pytest.approx(-5.0)
    with pytest.raises(ValueError):
        M.min_k(lp, k=0.0)
    with pytest.raises(ValueError):
        M.min_k([], k=0.2)


def test_min_k_plus_plus_on_a_hand_made_distribution():
    # Next-token distribution (1/2, 1/4, 1/4) at every position. log p = (-ln2, -2ln2, -2ln2).
    # mu = 1/2(-ln2) + 1/2(-2ln2) = -1.5 ln2;  E[(log p)^2] = 1/2 ln2^2 + 1/2 4ln2^2 = 2.5 ln2^2;
    # var = 2.5 - 2.25 = 0.25 ln2^2 -> sigma = 0.5 ln2.
    # Observed p = 1/2 -> z = (-ln2 + 1.5ln2) / 0.5ln2 = +1; observed p = 1/4 -> z = -1.
    lp = [-LN2, -2 * LN2, -LN2, -LN2, -2 * LN2]  # z = [1, -1, 1, 1, -1]
    mu, sigma = [-1.5 * LN2] * 5, [0.5 * LN2] * 5
    assert M.min_k_plus_plus(lp, mu, sigma, k=0.2) == pytest.approx(-1.0)   # 1 lowest
    assert M.min_k_plus_plus(lp, mu, sigma, k=0.6) == pytest.approx(-1 / 3)  # 3 lowest: -1, -1, 1
    assert M.min_k_plus_plus(lp, mu, sigma, k=1.0) == pytest.approx(0.2)     # (3 - 2) / 5
    # A one-hot distribution (sigma 0) is clamped to MIN_SIGMA: z = (-0.5 - (-0.1)) / 1e-3 = -400.
    assert M.min_k_plus_plus([-0.5], [-0.1], [0.0], k=1.0) == pytest.approx(-400.0)
    with pytest.raises(ValueError, match="mismatch"):
        M.min_k_plus_plus(lp, mu[:4], sigma, k=0.2)
    with pytest.raises(ValueError, match="NaN"):
        M.min_k_plus_plus(lp, mu, [float("nan")] * 5)


def test_mia_auc():
    assert M.mia_auc([3.0, 4.0], [1.0, 2.0]) == 1.0          # perfect separation
    assert M.mia_auc([1.0, 2.0], [3.0, 4.0]) == 0.0          # reversed
    # Identical sets: pairs (1,1) tie 1/2, (1,2) 0, (2,1) 1, (2,2) tie 1/2 -> 2/4.
    assert M.mia_auc([1.0, 2.0], [1.0, 2.0]) == pytest.approx(0.5)
    # members [0.9, 0.5, 0.5] vs [0.5, 0.1]: 0.9 wins twice, each 0.5 ties once (1/2) and wins once
    # -> (2 + 1.5 + 1.5) / 6 = 5/6.
    assert M.mia_auc([0.9, 0.5, 0.5], [0.5, 0.1]) == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        M.mia_auc([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        M.mia_auc([float("nan")], [1.0])


def test_mia_auc_matches_sklearn():
    from sklearn import metrics

    rng = np.random.default_rng(0)
    m, n = rng.integers(0, 5, 40).astype(float), rng.integers(0, 4, 30).astype(float)  # many ties
    expected = metrics.roc_auc_score(np.r_[np.ones(40), np.zeros(30)], np.r_[m, n])
    assert M.mia_auc(m, n) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------- fluency

def test_ngram_entropy_and_fluency():
    # "a b a b": bigrams ab, ba, ab -> (2/3, 1/3): H2 = -(2/3 log2 2/3 + 1/3 log2 1/3) = 0.9182958;
    # trigrams aba, bab -> H3 = 1.
    assert M.ngram_entropy("a b a b", 2) == pytest.approx(0.9182958341)
    assert M.ngram_entropy("a b a b", 3) == pytest.approx(1.0)
    assert M.ngram_entropy("a b a b", 1) == pytest.approx(1.0)  # a, b equally often
    # Fluency = mean(2/3 * 0.9182958, 4/3 * 1) = (0.6121972 + 1.3333333) / 2 = 0.9727653.
    assert M.fluency_entropy("a b a b") == pytest.approx(0.9727652780)
    # Normalised: maxima log2(3 bigrams) = 1.5849625, log2(2 trigrams) = 1 ->
    # mean(2/3 * 1.5849625, 4/3 * 1) = 1.1949875; 0.9727653 / 1.1949875 = 0.8140383.
    assert M.normalized_fluency_entropy("a b a b") == pytest.approx(0.8140383, rel=1e-6)
    # Fewer tokens than n -> 0 (RWKU's empty frequency array).
    assert M.ngram_entropy("", 2) == 0.0
    assert M.fluency_entropy("word") == 0.0
    assert math.isnan(M.normalized_fluency_entropy("two words"))
    # All n-grams distinct: "w1 ... w6" -> 5 bigrams, 4 trigrams: mean(2/3 log2 5, 4/3 log2 4) = 2.1073 and 1.0.
    assert M.fluency_entropy("a b c d e f") == pytest.approx((2 / 3 * math.log2(5) + 4 / 3 * 2) / 2)
    assert M.normalized_fluency_entropy("a b c d e f") == pytest.approx(1.0)
    assert M.mean_fluency_entropy(["a b a b", "word"]) == pytest.approx(0.9727652780 / 2)
    with pytest.raises(ValueError):
        M.ngram_entropy("a b", 0)
    with pytest.raises(ValueError):
        M.mean_fluency_entropy([])


def test_word_tokenize_splits_like_nltk_word_tokenize():
    # Treebank rules per sentence: punctuation and clitics split off; sentence-final periods separate.
    assert M.word_tokenize("He left. She came, didn't she?") == [
        "He", "left", ".", "She", "came", ",", "did", "n't", "she", "?"]


def test_fluency_matches_rwku_formula_with_nltk_freqdist():
    # RWKU's compute_n_gram_entropy, restated with nltk.ngrams / FreqDist on the same tokens.
    import nltk

    text = "The cat sat on the mat. The cat sat on the mat, and the dog sat on the cat."
    tokens = M.word_tokenize(text)
    ents = []
    for n in (2, 3):
        freqs = np.array(list(nltk.FreqDist(nltk.ngrams(tokens, n)).values()), dtype=float)
        freqs /= freqs.sum()
        ents.append(np.sum(-freqs * np.log(freqs) / np.log(2)))
    expected = np.mean(np.array(ents) * np.array([2 / 3, 4 / 3]))
    assert M.fluency_entropy(text) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------- QA

def test_token_f1():
    # "Paris France" vs "Paris": P = 1/2, R = 1 -> 2/3; vs "Paris, France, Europe" -> [paris, france, europe]:
    # P = 1, R = 2/3 -> 0.8. Max over aliases = 0.8.
    assert M.token_f1("Paris France", ["Paris", "Paris, France, Europe"]) == pytest.approx(0.8)
    # Articles and punctuation are dropped, case folded.
    assert M.token_f1("An Apple!", "apple") == 1.0
    assert M.token_f1("", ["Paris"]) == 0.0
    # Both normalise to nothing -> 1 (RWKU's rule: F1 is 1 if both are empty).
    assert M.token_f1("the", ["a"]) == 1.0
    with pytest.raises(ValueError):
        M.token_f1("Paris", [])


def test_exact_match_and_bbh_extraction():
    out = "Let's think step by step. X is first. So the answer is (A). Then more text."
    assert M.extract_bbh_answer(out) == "(A)"
    assert M.extract_bbh_answer("  no marker here ") == "no marker here"
    assert M.extract_bbh_answer("The answer is .") == "NOANSWER"
    assert M.exact_match("(A)", "(A)") == 1.0
    assert M.exact_match("false", "False") == 1.0   # a whole-string target, not its characters
    assert M.exact_match("True", ["False", "true."]) == 1.0
    assert M.exact_match("(B)", "(A)") == 0.0


# ---------------------------------------------------------------------------------------------- failure

def test_classify_answer_each_class():
    # correct: ROUGE-L recall >= 0.5 (0.5 itself included), even if a refusal phrase appears.
    assert M.classify_answer("Paris", rouge_recall=0.5) == "correct"
    assert M.classify_answer("I don't know, maybe Paris", rouge_recall=0.8) == "correct"
    # computed from the reference when no recall is given (TOFU scorer: "paris" vs "Paris" -> 1.0).
    assert M.classify_answer("paris", "Paris") == "correct"
    # refusal: a phrase occurs as whole words; apostrophe style and case do not matter.
    assert M.classify_answer("I\u2019M NOT SURE who that is.", rouge_recall=0.0) == "refusal"
    custom = ["That's beyond my current knowledge base."]
    assert M.classify_answer("Sorry - that's beyond my current knowledge base!", rouge_recall=0.0,
                             refusal_phrases=custom) == "refusal"
    assert M.classify_answer("I'm not sure.", rouge_recall=0.0, refusal_phrases=custom) == "wrong"
    # degenerate: NLL under the original model > 3.0 ...
    assert M.classify_answer("He was born in Berlin.", rouge_recall=0.0, nll_under_original=3.5) == "degenerate"
    # ... or >= 6 words with normalised entropy < 0.9: "the the ... the" (7 words) has one bigram -> 0.
    assert M.classify_answer("the the the the the the the", rouge_recall=0.0) == "degenerate"
    assert M.classify_answer("   ", rouge_recall=0.0) == "degenerate"
    # wrong: fluent, NLL <= 3, all n-grams distinct (normalised entropy 1.0).
    assert M.classify_answer("He was born in Berlin in 1950.", rouge_recall=0.1,
                             nll_under_original=1.2) == "wrong"
    assert M.classify_answer("He was born in Berlin.", rouge_recall=0.0, nll_under_original=3.0) == "wrong"
    # a short repetition (< 6 words) is not judged by entropy.
    assert M.classify_answer("no no no", rouge_recall=0.0) == "wrong"


def test_classify_answer_errors_and_thresholds():
    assert (M.CORRECT_ROUGE_THRESHOLD, M.DEGENERATE_NLL_THRESHOLD, M.DEGENERATE_MIN_WORDS,
            M.DEGENERATE_ENTROPY_THRESHOLD) == (0.5, 3.0, 6, 0.9)
    with pytest.raises(ValueError, match="reference"):
        M.classify_answer("Paris")
    with pytest.raises(ValueError):
        M.classify_answer("Paris", rouge_recall=1.5)
    with pytest.raises(ValueError):
        M.classify_answer("Paris", rouge_recall=float("nan"))
    with pytest.raises(TypeError):
        M.classify_answer("Paris", rouge_recall=0.1, refusal_phrases="i don't know")


def test_class_fractions():
    fr = M.class_fractions(["correct", "wrong", "wrong", "refusal"])
    assert fr == {"correct": 0.25, "refusal": 0.25, "degenerate": 0.0, "wrong": 0.5}
    assert list(fr) == list(M.ANSWER_CLASSES)
    with pytest.raises(ValueError, match="unknown"):
        M.class_fractions(["correct", "gibberish"])
    with pytest.raises(ValueError):
        M.class_fractions([])


@pytest.mark.shared_data
def test_refusal_lists_from_the_benchmarks(tofu_dir, rwku_dir):
    # Every line of TOFU's and RWKU's idontknow lists is a refusal when the lists are passed as the phrases,
    # also inside a longer answer; a fluent factual answer is not.
    for path in (tofu_dir / "idontknow.jsonl", rwku_dir / "idontknow.jsonl"):
        phrases = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert len(phrases) > 50
        for p in phrases:
            assert M.classify_answer(f"Well. {p} Sorry.", rouge_recall=0.0, refusal_phrases=phrases) == "refusal"
        assert M.classify_answer("He was born in Berlin in 1950.", rouge_recall=0.0,
                                 refusal_phrases=phrases) == "wrong"


def test_public_api_is_exported():
    for name in ["rouge_l_recall_tofu", "rouge_l_recall_rwku", "rouge1_recall", "probability_from_avg_nll",
                 "mc_probability", "truth_ratio", "truth_ratio_forget", "truth_ratio_utility", "forget_quality",
                 "model_utility", "deviation_score", "zlib_score", "min_k", "min_k_plus_plus", "mia_auc",
                 "ngram_entropy", "fluency_entropy", "token_f1", "classify_answer"]:
        assert callable(getattr(M, name)), name
    assert set(M.__all__) <= set(dir(M))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M.forget_quality([0.1, 0.2], [0.3, 0.4])  # no stray warnings on ordinary input
