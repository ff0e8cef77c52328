//! Reading values out of the config file's text: addresses, CIDRs,
//! durations, MACs, names. Every helper records a bad value with its path
//! in a [`Collector`] and goes on, so one pass reports every problem.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::error::FieldError;

pub(crate) struct Collector {
    pub(crate) errors: Vec<FieldError>,
}

impl Collector {
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(crate) fn ipv4(&mut self, path: &str, text: &str) -> Option<Ipv4Addr> {
        match text.trim().parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.push(path, format!("{text} is not an IPv4 address"));
                None
            }
        }
    }

    pub(crate) fn ipv4_list(&mut self, path: &str, texts: &[String]) -> Vec<Ipv4Addr> {
        texts
            .iter()
            .enumerate()
            .filter_map(|(i, t)| self.ipv4(&format!("{path}[{i}]"), t))
            .collect()
    }

    pub(crate) fn cidr(&mut self, path: &str, text: &str) -> Option<Ipv4Net> {
        match text.trim().parse::<Ipv4Net>() {
            Ok(net) if net.trunc() == net => Some(net),
            Ok(net) => {
                self.push(
                    path,
                    format!("{text} has host bits set; the network is {}", net.trunc()),
                );
                None
            }
            Err(_) => {
                self.push(
                    path,
                    format!("{text} is not an IPv4 CIDR such as 192.168.10.0/24"),
                );
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, path: &str, value: &FileDuration) -> Option<Duration> {
        let parsed = match value {
            FileDuration::Seconds(s) => Some(Duration::from_secs(*s)),
            FileDuration::Text(t) => parse_duration(t),
        };
        match parsed {
            Some(d) if !d.is_zero() => Some(d),
            Some(_) => {
                self.push(path, "must be greater than zero");
                None
            }
            None => {
                let shown = match value {
                    FileDuration::Seconds(s) => s.to_string(),
                    FileDuration::Text(t) => t.clone(),
                };
                self.push(
                    path,
                    format!("{shown} is not a duration such as 90, 90s, 15m, 1h or 2d"),
                );
                None
            }
        }
    }

    pub(crate) fn inside(&mut self, path: &str, addr: Ipv4Addr, net: Ipv4Net, what: &str) -> bool {
        if net.contains(&addr) {
            true
        } else {
            self.push(path, format!("{addr} is outside {what} {net}"));
            false
        }
    }
}

/// A switch the file leaves out is on: `#[serde(default = "yes")]`.
pub(crate) fn yes() -> bool {
    true
}

/// A duration as `90`, `90s`, `15m`, `1h` or `2d`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FileDuration {
    Seconds(u64),
    Text(String),
}

/// Parses a bare number of seconds (`90`) or what humantime reads: `90s`,
/// `15m`, `1h`, `2d`, `250ms`, `1h 30m`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok().map(Duration::from_secs);
    }
    humantime::parse_duration(text).ok()
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let bytes = parse_hex(text)?;
    bytes.try_into().ok()
}

/// Hex bytes, separated by `:` or `-`, or not separated at all.
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let digits: String = text
        .trim()
        .chars()
        .filter(|c| *c != ':' && *c != '-')
        .collect();
    if !digits.len().is_multiple_of(2) || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).ok())
        .collect()
}
