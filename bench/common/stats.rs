//! Percentiles and medians of a run's samples.
//!
//! The harnesses differ in which sample a percentile picks, and each keeps
//! its own definition ([`Rank`]); none interpolates between two samples.
//! Medians come in two kinds: [`median`] averages the two middle values of
//! an even count, [`upper_median`] takes the higher one.

use std::cmp::Ordering;
use std::time::Duration;

/// Which sample of `n` sorted ones is the `p`-th percentile (`p` in 0..=1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rank {
    /// Index `round((n - 1) · p)`, halves away from zero (`bench_gateway`,
    /// `bench_latency`).
    Round,
    /// Index `floor((n - 1) · p)` (`bench_ledger`).
    Floor,
    /// Index `floor(n · p)`, at most `n - 1` (`bench_operations`).
    FloorOfCount,
}

impl Rank {
    fn index(self, n: usize, p: f64) -> usize {
        match self {
            Rank::Round => ((n as f64 - 1.0) * p).round() as usize,
            Rank::Floor => ((n as f64 - 1.0) * p) as usize,
            Rank::FloorOfCount => ((n as f64 * p) as usize).min(n.saturating_sub(1)),
        }
    }
}

/// The `p`-th percentile of `sorted` (ascending) by `rank`; `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64, rank: Rank) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    sorted.get(rank.index(sorted.len(), p)).copied()
}

/// [`percentile`] in milliseconds; NaN when `sorted` is empty.
pub fn percentile_ms(sorted: &[Duration], p: f64, rank: Rank) -> f64 {
    percentile(sorted, p, rank).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// The median of `values` (sorted in place, by `f64::total_cmp`): the
/// middle value, or the mean of the two middle ones; NaN when empty.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A value a median can be taken of: totally ordered (`f64` by `total_cmp`).
pub trait Sample: Copy {
    fn order(&self, other: &Self) -> Ordering;
}

impl Sample for f64 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

impl Sample for u64 {
    fn order(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// The upper median of `values`: the value at index `n / 2` once sorted (of
/// an even count, the higher middle one); `None` when empty.
pub fn upper_median<T: Sample>(values: &[T]) -> Option<T> {
    let mut values = values.to_vec();
    values.sort_by(T::order);
    values.get(values.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn ranks_pick_their_samples() {
        let sorted = ms(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let at = |p, rank| percentile(&sorted, p, rank).unwrap().as_millis();
        assert_eq!(at(0.5, Rank::Round), 6);
        assert_eq!(at(0.5, Rank::Floor), 5);
        assert_eq!(at(0.5, Rank::FloorOfCount), 6);
        assert_eq!(at(0.99, Rank::Round), 10);
        assert_eq!(at(0.99, Rank::Floor), 9);
        assert_eq!(at(1.0, Rank::FloorOfCount), 10);
        assert_eq!(percentile(&[], 0.5, Rank::Round), None);
        assert!(percentile_ms(&[], 0.5, Rank::Round).is_nan());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert!(median(&mut []).is_nan());
        assert_eq!(upper_median(&[3.0, 1.0, 2.0, 10.0]), Some(3.0));
        assert_eq!(upper_median(&[4_u64, 1, 2]), Some(2));
        assert_eq!(upper_median::<u64>(&[]), None);
    }
}
