//! The named styles of the LR schedule (decay, WSD anneal) and of the weight-decay schedule,
//! spelled exactly as Megatron's flags and state dicts spell them (SPEC §6.3, §6.4).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// `--lr-decay-style`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecayStyle {
    #[serde(rename = "constant")]
    Constant,
    #[serde(rename = "linear")]
    Linear,
    #[serde(rename = "cosine")]
    Cosine,
    #[serde(rename = "inverse-square-root")]
    InverseSquareRoot,
    #[serde(rename = "WSD")]
    Wsd,
}

/// `--lr-wsd-decay-style`: the anneal at the end of a WSD schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WsdDecayStyle {
    #[serde(rename = "linear")]
    Linear,
    #[serde(rename = "cosine")]
    Cosine,
    #[serde(rename = "exponential")]
    Exponential,
    #[serde(rename = "minus_sqrt")]
    MinusSqrt,
}

/// `--weight-decay-incr-style`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WdIncrStyle {
    #[serde(rename = "constant")]
    Constant,
    #[serde(rename = "linear")]
    Linear,
    #[serde(rename = "cosine")]
    Cosine,
}

impl DecayStyle {
    pub const ALL: [DecayStyle; 5] =
        [DecayStyle::Constant, DecayStyle::Linear, DecayStyle::Cosine, DecayStyle::InverseSquareRoot, DecayStyle::Wsd];

    /// Megatron's spelling (also the value stored in the scheduler state dict).
    pub fn as_str(self) -> &'static str {
        match self {
            DecayStyle::Constant => "constant",
            DecayStyle::Linear => "linear",
            DecayStyle::Cosine => "cosine",
            DecayStyle::InverseSquareRoot => "inverse-square-root",
            DecayStyle::Wsd => "WSD",
        }
    }

    /// Parses the value of `flag`; the error names the flag and the accepted values.
    pub fn parse(s: &str, flag: &str) -> Result<DecayStyle> {
        match DecayStyle::ALL.into_iter().find(|d| d.as_str() == s) {
            Some(d) => Ok(d),
            None => bail!(
                "{flag} `{s}` is not a decay style: expected one of {}",
                names(&DecayStyle::ALL.map(|d| d.as_str()))
            ),
        }
    }
}

impl WsdDecayStyle {
    pub const ALL: [WsdDecayStyle; 4] =
        [WsdDecayStyle::Linear, WsdDecayStyle::Cosine, WsdDecayStyle::Exponential, WsdDecayStyle::MinusSqrt];

    pub fn as_str(self) -> &'static str {
        match self {
            WsdDecayStyle::Linear => "linear",
            WsdDecayStyle::Cosine => "cosine",
            WsdDecayStyle::Exponential => "exponential",
            WsdDecayStyle::MinusSqrt => "minus_sqrt",
        }
    }

    pub fn parse(s: &str, flag: &str) -> Result<WsdDecayStyle> {
        match WsdDecayStyle::ALL.into_iter().find(|d| d.as_str() == s) {
            Some(d) => Ok(d),
            None => bail!(
                "{flag} `{s}` is not a WSD decay style: expected one of {}",
                names(&WsdDecayStyle::ALL.map(|d| d.as_str()))
            ),
        }
    }

    /// The anneal coefficient at fraction `w` in `[0, 1]` of the WSD decay phase.
    pub fn coeff(self, w: f64) -> f64 {
        match self {
            WsdDecayStyle::Linear => 1.0 - w,
            WsdDecayStyle::Cosine => 0.5 * ((std::f64::consts::PI * w).cos() + 1.0),
            WsdDecayStyle::Exponential => 2.0 * 0.5f64.powf(w) - 1.0,
            WsdDecayStyle::MinusSqrt => 1.0 - w.sqrt(),
        }
    }
}

impl WdIncrStyle {
    pub const ALL: [WdIncrStyle; 3] = [WdIncrStyle::Constant, WdIncrStyle::Linear, WdIncrStyle::Cosine];

    pub fn as_str(self) -> &'static str {
        match self {
            WdIncrStyle::Constant => "constant",
            WdIncrStyle::Linear => "linear",
            WdIncrStyle::Cosine => "cosine",
        }
    }

    pub fn parse(s: &str, flag: &str) -> Result<WdIncrStyle> {
        match WdIncrStyle::ALL.into_iter().find(|d| d.as_str() == s) {
            Some(d) => Ok(d),
            None => bail!(
                "{flag} `{s}` is not a weight-decay increment style: expected one of {}",
                names(&WdIncrStyle::ALL.map(|d| d.as_str()))
            ),
        }
    }
}

fn names(list: &[&str]) -> String {
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn styles_round_trip_through_their_megatron_spelling() {
        for d in DecayStyle::ALL {
            assert_eq!(DecayStyle::parse(d.as_str(), "--lr-decay-style").unwrap(), d);
            assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(d.as_str()));
        }
        for d in WsdDecayStyle::ALL {
            assert_eq!(WsdDecayStyle::parse(d.as_str(), "--lr-wsd-decay-style").unwrap(), d);
            assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(d.as_str()));
        }
        for d in WdIncrStyle::ALL {
            assert_eq!(WdIncrStyle::parse(d.as_str(), "--weight-decay-incr-style").unwrap(), d);
        }
        let err = DecayStyle::parse("wsd", "--lr-decay-style").unwrap_err().to_string();
        assert!(err.contains("--lr-decay-style") && err.contains("WSD"), "{err}");
    }
}
