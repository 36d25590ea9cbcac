//! Argument parsers for clap's `value_parser`, shared by `ccol` and the
//! examples so that the same mistake gets the same message everywhere.

use std::fmt::Display;
use std::str::FromStr;

/// A whole number of at least 1 (`--rounds`, `--steps`, `--batch-size`):
/// `0` is "must be at least 1" (clap's own `range(1..)` says
/// "not in 1..18446744073709551615"), anything else that does not parse is
/// "not a whole number of at least 1 (…)".
///
/// ```
/// use compiler_collectives_harness::args::at_least_one;
/// assert_eq!(at_least_one::<u64>("12"), Ok(12));
/// assert_eq!(at_least_one::<usize>("0"), Err("must be at least 1".to_string()));
/// ```
///
/// # Errors
/// The message clap prints after `invalid value '…' for '--flag <N>': `.
pub fn at_least_one<T>(text: &str) -> Result<T, String>
where
    T: FromStr + PartialOrd + From<u8>,
    T::Err: Display,
{
    match text.trim().parse::<T>() {
        Ok(n) if n < T::from(1) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number of at least 1 ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::at_least_one;

    #[test]
    fn whole_numbers_of_at_least_one() {
        let check = |text: &str, want: Result<u64, &str>| {
            assert_eq!(
                at_least_one::<u64>(text),
                want.map_err(str::to_owned),
                "{text:?}"
            );
        };
        check("1", Ok(1));
        check(" 200 ", Ok(200));
        check("18446744073709551615", Ok(u64::MAX));
        check("0", Err("must be at least 1"));
        check(
            "-1",
            Err("not a whole number of at least 1 (invalid digit found in string)"),
        );
        check(
            "",
            Err("not a whole number of at least 1 (cannot parse integer from empty string)"),
        );
        check(
            "18446744073709551616",
            Err("not a whole number of at least 1 (number too large to fit in target type)"),
        );
        assert_eq!(
            at_least_one::<u32>("4294967296"),
            Err(
                "not a whole number of at least 1 (number too large to fit in target type)"
                    .to_owned()
            )
        );
    }
}
