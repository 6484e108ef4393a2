//! Dates and timestamps: Postgres' ISO text output (`DateStyle=ISO`, which the replication
//! connection pins) to ISO-8601 as the consumers' parsers read it.
//!
//! Contract: the `T` separator; `+hh:mm` offsets (Postgres writes `+00`); years before 1
//! AD or after 9999 in ISO-8601's expanded form with astronomical numbering (`0044-03-15
//! BC` is `-0043-03-15`, `12345-01-01` is `+12345-01-01`); `infinity` / `-infinity` as
//! they are. The rest of the text (time of day, fractions, an offset with seconds) is
//! passed through unchecked. Returns the text, not JSON; Err names what did not parse.

/// A year of four digits, not BC: the text needs no rewriting (the common case).
pub(crate) fn common_era(v: &str) -> bool {
    v.len() >= 5 && v.as_bytes()[4] == b'-' && !v.ends_with('C')
}

/// Postgres writes `0044-03-15 BC` and `12345-01-01`; ISO-8601's expanded form, with
/// astronomical years, is `-0043-03-15` and `+12345-01-01` (what Spark and Java's ISO
/// parsers read). `infinity` / `-infinity` stay as they are.
pub(crate) fn expanded_year(v: &str) -> Result<String, String> {
    if v == "infinity" || v == "-infinity" {
        return Ok(v.to_string());
    }
    let (v, bc) = match v.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (v, false),
    };
    let dash = v.find('-').ok_or_else(|| format!("no year in {v:?}"))?;
    let mut year: i64 = v[..dash]
        .parse()
        .map_err(|_| format!("bad year in {v:?}"))?;
    if bc {
        year = 1 - year;
    }
    let head = if (0..=9999).contains(&year) {
        format!("{year:04}")
    } else {
        format!("{year:+05}")
    };
    Ok(head + &v[dash..])
}

/// A timestamp (`with_zone`: a timestamptz) in ISO-8601: `T`-separated, a two-digit
/// offset completed to `+hh:mm`.
pub(crate) fn timestamp(v: &str, with_zone: bool) -> Result<String, String> {
    let mut s = if common_era(v) {
        v.to_string()
    } else {
        let s = expanded_year(v)?;
        if s == "infinity" || s == "-infinity" {
            return Ok(s);
        }
        s
    };
    s = s.replacen(' ', "T", 1);
    if with_zone {
        // "+00" / "-05" / "+05:30": ISO-8601 wants hh:mm.
        let sign = match (s.rfind('+'), s.rfind('-')) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = sign {
            if at > 10 && s.len() - at - 1 == 2 {
                s.push_str(":00");
            }
        }
    }
    Ok(s)
}

// Expected values are what pg2kafka's Python tests expect of the same Postgres text
// (tests/unit/pg2kafka/test_types.py) and what the built extension returns.
#[cfg(test)]
mod tests {
    use super::*;

    fn ts(v: &str) -> String {
        timestamp(v, false).unwrap()
    }

    fn tz(v: &str) -> String {
        timestamp(v, true).unwrap()
    }

    #[test]
    fn four_digit_years_of_the_common_era_need_no_rewriting() {
        assert!(common_era("2024-02-29"));
        assert!(common_era("0001-01-01"));
        assert!(common_era("2024-02-29 13:14:15+00"));
        assert!(!common_era("0044-03-15 BC"));
        assert!(!common_era("0044-03-15 12:00:00+00 BC"));
        assert!(!common_era("12345-01-01"));
        assert!(!common_era("infinity"));
        assert!(!common_era("-infinity"));
        assert!(!common_era("2024"));
    }

    #[test]
    fn years_bc_are_astronomical_and_expanded() {
        assert_eq!(expanded_year("0044-03-15 BC").unwrap(), "-0043-03-15");
        assert_eq!(expanded_year("0001-01-01 BC").unwrap(), "0000-01-01");
        assert_eq!(expanded_year("0002-01-01 BC").unwrap(), "-0001-01-01");
        assert_eq!(expanded_year("4713-11-24 BC").unwrap(), "-4712-11-24");
        assert_eq!(expanded_year("10000-01-01 BC").unwrap(), "-9999-01-01");
        assert_eq!(expanded_year("10001-01-01 BC").unwrap(), "-10000-01-01");
    }

    #[test]
    fn years_after_9999_get_a_plus_sign() {
        assert_eq!(expanded_year("12345-01-01").unwrap(), "+12345-01-01");
        assert_eq!(expanded_year("10000-12-31").unwrap(), "+10000-12-31");
        assert_eq!(expanded_year("294276-12-31").unwrap(), "+294276-12-31");
        // the rewrite is only of the year: a common-era date through it is unchanged
        assert_eq!(expanded_year("2024-02-29").unwrap(), "2024-02-29");
    }

    #[test]
    fn infinities_stay_as_they_are() {
        for v in ["infinity", "-infinity"] {
            assert_eq!(expanded_year(v).unwrap(), v);
            assert_eq!(ts(v), v);
            assert_eq!(tz(v), v);
        }
    }

    #[test]
    fn text_without_a_year_is_refused() {
        assert_eq!(
            expanded_year("garbage"),
            Err(r#"no year in "garbage""#.into())
        );
        assert_eq!(expanded_year("xy-01"), Err(r#"bad year in "xy-01""#.into()));
        assert_eq!(
            expanded_year("xy-01 BC"),
            Err(r#"bad year in "xy-01""#.into())
        );
        assert_eq!(timestamp("soon", false), Err(r#"no year in "soon""#.into()));
    }

    #[test]
    fn timestamps_are_t_separated() {
        assert_eq!(
            ts("2024-02-29 13:14:15.123456"),
            "2024-02-29T13:14:15.123456"
        );
        assert_eq!(ts("2024-02-29 13:14:15"), "2024-02-29T13:14:15");
        assert_eq!(ts("0044-03-15 12:00:00 BC"), "-0043-03-15T12:00:00");
        assert_eq!(ts("12345-06-07 01:02:03.5"), "+12345-06-07T01:02:03.5");
    }

    #[test]
    fn timestamptz_offsets_become_hh_mm() {
        assert_eq!(
            tz("2024-02-29 13:14:15.5+00"),
            "2024-02-29T13:14:15.5+00:00"
        );
        assert_eq!(tz("2024-02-29 13:14:15-05"), "2024-02-29T13:14:15-05:00");
        assert_eq!(tz("2024-02-29 13:14:15+05:30"), "2024-02-29T13:14:15+05:30");
        // an offset with seconds (local mean time of old dates) is passed through
        assert_eq!(
            tz("1900-01-01 00:00:00-09:30:15"),
            "1900-01-01T00:00:00-09:30:15"
        );
        assert_eq!(
            tz("0044-03-15 12:00:00+00 BC"),
            "-0043-03-15T12:00:00+00:00"
        );
        assert_eq!(
            tz("0044-03-15 12:00:00-05 BC"),
            "-0043-03-15T12:00:00-05:00"
        );
        assert_eq!(tz("12345-06-07 01:02:03+14"), "+12345-06-07T01:02:03+14:00");
    }

    #[test]
    fn the_date_dashes_are_not_taken_for_an_offset() {
        // no offset: the last '-' is the date's (before position 10), nothing is added
        assert_eq!(tz("2024-02-29 13:14:15"), "2024-02-29T13:14:15");
        assert_eq!(tz("2024-02-29"), "2024-02-29");
    }
}
