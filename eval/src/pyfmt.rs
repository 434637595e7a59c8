//! Numbers printed as Python prints them, so result lines match Megatron's byte for byte:
//! `'{:.4E}'.format(x)` ([`sci4`]) and `'{}'.format(x)` of a float ([`repr`]).

/// Python's `{:.4E}`: four decimals, upper-case `E`, a signed exponent of at least two digits
/// (`1.2346E+00`, `5.0000E-07`, `inf`, `nan`).
pub fn sci4(x: f64) -> String {
    if x.is_nan() {
        return "NAN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "INF".into() } else { "-INF".into() };
    }
    let s = format!("{x:.4E}"); // Rust: `1.2346E0`, `5.0000E-7`
    let (mant, exp) = s.split_once('E').unwrap_or((&s, "0"));
    let e: i32 = exp.parse().unwrap_or(0);
    format!("{mant}E{}{:02}", if e < 0 { '-' } else { '+' }, e.unsigned_abs())
}

/// Python's `repr(float)`: the shortest string that round-trips, `.0` on integral values,
/// scientific notation (`1e-05`, `1.5e+16`) below 1e-4 and from 1e16 on.
pub fn repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let a = x.abs();
    if x == 0.0 || (1e-4..1e16).contains(&a) {
        let s = format!("{x}");
        return if s.contains('.') { s } else { format!("{s}.0") };
    }
    let s = format!("{x:e}"); // Rust: `1e-5`, `1.5e16`
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = exp.parse().unwrap_or(0);
    format!("{mant}e{}{:02}", if e < 0 { '-' } else { '+' }, e.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_python() {
        // Values printed by CPython 3.11.
        assert_eq!(sci4(1.23456), "1.2346E+00");
        assert_eq!(sci4(0.0), "0.0000E+00");
        assert_eq!(sci4(5153.0), "5.1530E+03");
        assert_eq!(sci4(4.85e-7), "4.8500E-07");
        assert_eq!(sci4(-2.5e123), "-2.5000E+123");
        assert_eq!(repr(1.0), "1.0");
        assert_eq!(repr(1.2345678901234567), "1.2345678901234567");
        assert_eq!(repr(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(repr(1e-5), "1e-05");
        assert_eq!(repr(1.5e16), "1.5e+16");
        assert_eq!(repr(123456.0), "123456.0");
        assert_eq!(repr(0.0001), "0.0001");
    }
}
