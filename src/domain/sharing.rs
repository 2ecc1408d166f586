//! How an AI provider's slots are shared among the experiences on it: the
//! rule the claim applies, slot by slot, under the provider's lock.
//!
//! The next saga to start goes to the experience with work whose slots in
//! use, divided by its weight, are the fewest (ties: the older
//! experience), as long as the provider's free slots and the experience's
//! own ceiling allow it. This is max-min fairness on what each experience
//! holds now, which makes it
//! - weighted: with weights 2 and 1 and both flooded, slots settle 2:1;
//! - work-conserving: an experience without queued work asks for nothing,
//!   so its share goes to the others at once, and it gets its share back as
//!   soon as it has work, one freed slot at a time (no slot is taken from a
//!   running job);
//! - per experience, never per key: a booth that spreads its load over many
//!   sessions or terminals is still one claimant.
//!
//! Nothing is remembered between rounds: the slots in use (the rows of the
//! slot ledger) are the state, read in the claim's transaction, so the
//! rule is the same on every instance and survives restarts.

/// One experience as the claim sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant {
    /// Its share, 1 to 100.
    pub weight: i64,
    /// Slots it holds now, plus those granted in this round.
    pub used: i64,
    /// Its own `max_in_flight`.
    pub ceiling: i64,
    /// Slots one of its sagas asks for (`ai_calls`; a fan-out saga also
    /// starts with fewer when fewer are free, and grows later).
    pub per_saga: i64,
    /// It may still have queued sagas (false once a claim came back short).
    pub has_work: bool,
}

/// Who gets the next saga, and with how many slots; None when nobody can
/// have one (no free slot, or nobody with work below its ceiling). `free`:
/// the provider's free slots (None: no shared cap).
pub fn next_grant(claimants: &[Claimant], free: Option<i64>) -> Option<(usize, i64)> {
    if free.is_some_and(|f| f <= 0) {
        return None;
    }
    let mut best: Option<usize> = None;
    for (i, c) in claimants.iter().enumerate() {
        if !c.has_work || c.used >= c.ceiling {
            continue;
        }
        let fewer = match best {
            None => true,
            // used_i / w_i < used_b / w_b, without division.
            Some(b) => {
                let other = &claimants[b];
                i128::from(c.used) * i128::from(other.weight.max(1))
                    < i128::from(other.used) * i128::from(c.weight.max(1))
            }
        };
        if fewer {
            best = Some(i);
        }
    }
    let i = best?;
    let c = &claimants[i];
    let mut slots = c.per_saga.max(1).min(c.ceiling - c.used);
    if let Some(free) = free {
        slots = slots.min(free);
    }
    Some((i, slots.max(1)))
}

/// The slots an experience can count on while every experience with work
/// on its provider keeps its share: `cap × weight / (weight + others)`,
/// rounded down, at least 1 and at most its own `ceiling`. `others`: the
/// weights of the provider's other experiences with work. `cap` None (no
/// shared cap): its ceiling. For the 202's wait estimate.
pub fn share_of(cap: Option<i64>, weight: i64, others: i64, ceiling: i64) -> i64 {
    match cap {
        None => ceiling,
        Some(cap) => {
            let weight = weight.max(1);
            (cap * weight / (weight + others.max(0))).clamp(1, ceiling.max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_counts_only_experiences_with_work() {
        assert_eq!(share_of(Some(6), 1, 1, 20), 3);
        assert_eq!(share_of(Some(6), 1, 0, 20), 6);
        assert_eq!(share_of(Some(6), 2, 1, 20), 4);
        assert_eq!(share_of(Some(6), 1, 2, 2), 2);
        assert_eq!(
            share_of(Some(6), 1, 50, 20),
            1,
            "never 0: it still gets slots in turn"
        );
        assert_eq!(share_of(None, 1, 5, 7), 7);
    }

    fn claimant(weight: i64, used: i64) -> Claimant {
        Claimant {
            weight,
            used,
            ceiling: 100,
            per_saga: 1,
            has_work: true,
        }
    }

    /// Grants `n` sagas one by one, as the claim does.
    fn share(claimants: &mut [Claimant], mut free: Option<i64>, n: usize) -> Vec<i64> {
        let mut granted = vec![0; claimants.len()];
        for _ in 0..n {
            let Some((i, slots)) = next_grant(claimants, free) else {
                break;
            };
            claimants[i].used += slots;
            granted[i] += slots;
            free = free.map(|f| f - slots);
        }
        granted
    }

    #[test]
    fn a_newcomer_gets_the_freed_slots_until_it_has_its_share() {
        // Cap 6: A holds 3 (three of its jobs just ended), B arrives.
        let mut c = [claimant(1, 3), claimant(1, 0)];
        assert_eq!(share(&mut c, Some(3), 10), vec![0, 3]);
    }

    #[test]
    fn weights_share_in_proportion() {
        let mut c = [claimant(2, 0), claimant(1, 0)];
        assert_eq!(share(&mut c, Some(9), 100), vec![6, 3]);
    }

    #[test]
    fn an_idle_share_is_lent_to_the_others() {
        let mut c = [claimant(1, 0), claimant(1, 0)];
        c[1].has_work = false;
        assert_eq!(share(&mut c, Some(6), 100), vec![6, 0]);
    }

    #[test]
    fn never_above_the_ceiling_nor_the_cap() {
        let mut c = [claimant(1, 0), claimant(1, 0), claimant(1, 0)];
        c[0].ceiling = 1;
        assert_eq!(share(&mut c, Some(6), 100), vec![1, 3, 2]);
        let mut c = [claimant(1, 6)];
        assert_eq!(share(&mut c, Some(0), 100), vec![0]);
    }

    #[test]
    fn without_a_shared_cap_each_fills_its_ceiling() {
        let mut c = [claimant(1, 0), claimant(1, 0)];
        c[0].ceiling = 2;
        c[1].ceiling = 3;
        assert_eq!(share(&mut c, None, 100), vec![2, 3]);
    }

    #[test]
    fn a_fan_out_saga_takes_its_calls_or_what_is_free() {
        let mut c = [Claimant {
            per_saga: 4,
            ..claimant(1, 0)
        }];
        assert_eq!(next_grant(&c, Some(3)), Some((0, 3)));
        c[0].ceiling = 2;
        assert_eq!(next_grant(&c, Some(6)), Some((0, 2)));
    }

    #[test]
    fn ties_go_to_the_older_experience() {
        let c = [claimant(1, 2), claimant(1, 2)];
        assert_eq!(next_grant(&c, Some(1)), Some((0, 1)));
    }
}
