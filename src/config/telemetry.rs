//! `[telemetry]`: OpenTelemetry traces over OTLP, off unless
//! `otlp_endpoint` is set. Parsed here into `crate::telemetry::Settings`
//! (read ahead of the rest of the file: `config::read_ahead_telemetry`);
//! installed by `main` (the tracing subscriber).

use serde::Deserialize;

use crate::telemetry::{Protocol, Settings};

/// `[telemetry]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// The collector's OTLP base URL (`http://127.0.0.1:4318`); spans go to
    /// `<endpoint>/v1/traces`. Unset: no traces are exported.
    pub otlp_endpoint: Option<String>,
    /// Only "http/protobuf": one exporter, no gRPC stack in the binary.
    pub protocol: Option<String>,
    /// `service.name` of the spans (default "leasegate"), to tell several
    /// deployments apart in one collector.
    pub service_name: Option<String>,
    /// Fraction of new traces kept (default 1.0); an agent's sampled flag
    /// wins for traces it started, so one trace is never half exported.
    pub sampling_ratio: Option<f64>,
    /// Longest one export may take (default "10s"); also bounds the flush
    /// at shutdown.
    pub export_timeout: Option<String>,
}

impl RawTelemetry {
    /// Checks values; errors name the field (`telemetry.<field>`).
    pub fn validate(&self) -> Result<Settings, String> {
        let defaults = Settings::default();
        let otlp_endpoint = match &self.otlp_endpoint {
            None => None,
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                if url.starts_with("https://") {
                    return Err(format!(
                        "telemetry.otlp_endpoint: {url:?}: https is not supported (this build exports \
                         without TLS); send to a local collector over http"
                    ));
                }
                Some(url.clone())
            }
            Some(url) => {
                return Err(format!(
                    "telemetry.otlp_endpoint: {url:?} is not an http URL like \"http://127.0.0.1:4318\""
                ));
            }
        };
        let protocol = match &self.protocol {
            None => defaults.protocol,
            Some(text) => Protocol::parse(text).map_err(|e| format!("telemetry.protocol: {e}"))?,
        };
        let service_name = match &self.service_name {
            None => defaults.service_name,
            Some(name) if !name.trim().is_empty() && name.len() <= 255 => name.clone(),
            Some(name) => {
                return Err(format!(
                    "telemetry.service_name: {name:?} must be 1 to 255 bytes, not blank"
                ));
            }
        };
        let sampling_ratio = match self.sampling_ratio {
            None => defaults.sampling_ratio,
            Some(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
            Some(ratio) => {
                return Err(format!(
                    "telemetry.sampling_ratio: {ratio} is not between 0.0 and 1.0"
                ));
            }
        };
        let export_timeout = match &self.export_timeout {
            None => defaults.export_timeout,
            Some(text) => {
                let timeout = crate::policy::parse_duration("telemetry.export_timeout", text)
                    .map_err(|e| e.to_string())?;
                if timeout < std::time::Duration::from_millis(100)
                    || timeout > std::time::Duration::from_secs(60)
                {
                    return Err(format!(
                        "telemetry.export_timeout: {text:?} is not between 100ms and 60s"
                    ));
                }
                timeout
            }
        };
        Ok(Settings {
            otlp_endpoint,
            protocol,
            service_name,
            sampling_ratio,
            export_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, String> {
        toml::from_str::<RawTelemetry>(text)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn telemetry_is_off_by_default() {
        assert_eq!(parse("").unwrap(), Settings::default());
        assert_eq!(Settings::default().otlp_endpoint, None);
    }

    #[test]
    fn every_field_is_read_and_bad_values_are_named() {
        let settings = parse(
            "otlp_endpoint = \"http://127.0.0.1:4318\"\nprotocol = \"http/protobuf\"\n\
             service_name = \"gate-eu\"\nsampling_ratio = 0.25\nexport_timeout = \"2s\"",
        )
        .unwrap();
        assert_eq!(
            settings.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(settings.service_name, "gate-eu");
        assert_eq!(settings.sampling_ratio, 0.25);
        assert_eq!(settings.export_timeout, std::time::Duration::from_secs(2));
        for (text, error) in [
            (
                "sampling_ratio = 1.5",
                "telemetry.sampling_ratio: 1.5 is not between 0.0 and 1.0",
            ),
            (
                "protocol = \"grpc\"",
                "telemetry.protocol: \"grpc\" is not a supported protocol (expected \"http/protobuf\")",
            ),
            (
                "otlp_endpoint = \"collector:4318\"",
                "telemetry.otlp_endpoint: \"collector:4318\" is not an http URL like \"http://127.0.0.1:4318\"",
            ),
            (
                "service_name = \" \"",
                "telemetry.service_name: \" \" must be 1 to 255 bytes, not blank",
            ),
            (
                "export_timeout = \"5m\"",
                "telemetry.export_timeout: \"5m\" is not between 100ms and 60s",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err(), error, "{text}");
        }
    }
}
