//! [`ContextBuilder`]: the one way to open a [`Context`].

use std::fmt;
use std::sync::Arc;

use crate::backend::opencl::OpenClBackend;
use crate::backend::vulkan::VulkanBackend;
use crate::backend::{ComputeBackend, DeviceInfo};
use crate::cache::StoreChain;
use crate::cache::events::CacheObserver;
use crate::config::{BackendKind, Config, DeviceSelector};
use crate::error::Result;
use crate::warnings::{Warning, WarningCallback};

use super::context::Context;
use crate::backend::opencl::OpenClHandles;
use crate::backend::vulkan::VulkanHandles;

/// Makes the context over a backend the caller opened, once the configuration and stores are known.
type OpenBackend = Box<dyn FnOnce(&Config, StoreChain) -> Context + Send>;

/// Where the context's device comes from.
enum Device {
    /// The configuration's selector (`KPC_DEVICE`), or the one given.
    Select(Option<DeviceSelector>),
    /// A device discovery reported.
    Info(DeviceInfo),
    /// The embedder's Vulkan objects (the caller vouched for them in `vulkan_handles`).
    Vulkan(VulkanHandles),
    /// The embedder's OpenCL objects (the caller vouched for them in `opencl_handles`).
    OpenCl(OpenClHandles),
    /// A backend the caller opened (with backend-specific options).
    Backend(OpenBackend),
}

/// Opens a [`Context`]: which device (by default the one `KPC_DEVICE` selects; or a selector, a
/// device from [`crate::platforms`], or the embedder's own Vulkan or OpenCL objects), which
/// configuration (by default [`Config::from_env`]), which persistent stores (by default those the
/// configuration names: the disk cache, read-only layers, a remote) and where warnings go.
///
/// ```no_run
/// let ctx = kpc::Context::builder().build()?; // KPC_DEVICE's device, the environment's config
/// # Ok::<(), kpc::Error>(())
/// ```
///
/// Guarantees: `build` either returns a working context or an error and leaves nothing open; the
/// same device and driver give the same cache keys whichever way the context was opened (an
/// interop context hits what an owned one stored, and the other way round). Setters only record:
/// nothing is checked or opened before `build`. The device setters (`selector`, `device`,
/// `vulkan_handles`, `opencl_handles`, `backend`) replace one another, so the last one called
/// chooses the device.
#[must_use = "a builder does nothing until `build` is called"]
pub struct ContextBuilder {
    config: Option<Config>,
    device: Device,
    stores: Option<StoreChain>,
    observers: Vec<Arc<dyn CacheObserver>>,
    on_warning: Option<WarningCallback>,
}

impl Default for ContextBuilder {
    fn default() -> Self {
        ContextBuilder {
            config: None,
            device: Device::Select(None),
            stores: None,
            observers: Vec::new(),
            on_warning: None,
        }
    }
}

impl fmt::Debug for ContextBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let device = match &self.device {
            Device::Select(s) => format!("select {s:?}"),
            Device::Info(d) => format!("{}:{} {}", d.backend, d.index, d.name),
            Device::Vulkan(_) => "the embedder's Vulkan device".into(),
            Device::OpenCl(_) => "the embedder's OpenCL device".into(),
            Device::Backend(_) => "an opened backend".into(),
        };
        f.debug_struct("ContextBuilder")
            .field("device", &device)
            .field("config", &self.config.is_some())
            .field("stores", &self.stores.is_some())
            .finish()
    }
}

impl Context {
    /// Opens a context: `Context::builder().build()` is the device `KPC_DEVICE` selects with the
    /// configuration of the environment; see [`ContextBuilder`] for the rest (a device, the
    /// embedder's Vulkan or OpenCL handles, stores, a configuration, a warning sink).
    pub fn builder() -> ContextBuilder {
        ContextBuilder::default()
    }
}

impl ContextBuilder {
    /// Uses `config` instead of [`Config::from_env`].
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Opens the device `selector` picks (instead of the configuration's, `KPC_DEVICE`).
    pub fn selector(mut self, selector: DeviceSelector) -> Self {
        self.device = Device::Select(Some(selector));
        self
    }

    /// Opens `device`, one that [`crate::platforms`] or [`crate::select_device`] reported.
    pub fn device(mut self, device: &DeviceInfo) -> Self {
        self.device = Device::Info(device.clone());
        self
    }

    /// Runs over the embedder's Vulkan instance, device and queue, which kpc borrows and never
    /// destroys (the whole contract: [`crate::interop`]). Vulkan 1.1 or later; the features the
    /// embedder enabled are declared in [`VulkanHandles::enabled`].
    ///
    /// # Safety
    /// The handles are valid, belong together, and stay alive until every kpc object made from the
    /// context is dropped; [`VulkanHandles::enabled`] is truthful; the embedder serializes its use
    /// of the queue with kpc's as [`crate::interop`] says.
    pub unsafe fn vulkan_handles(mut self, handles: &VulkanHandles) -> Self {
        self.device = Device::Vulkan(*handles);
        self
    }

    /// Runs over the embedder's OpenCL context, device and queue; kpc retains the context and queue
    /// and releases them when its last object is dropped (the whole contract: [`crate::interop`]).
    ///
    /// # Safety
    /// The handles are valid and belong together (the device is one of the context's, the queue
    /// the context's on that device).
    pub unsafe fn opencl_handles(mut self, handles: &OpenClHandles) -> Self {
        self.device = Device::OpenCl(*handles);
        self
    }

    /// Runs over `backend`, a device the caller opened through [`crate::admin`] (for example with
    /// backend-specific options).
    pub fn backend<B: ComputeBackend>(mut self, backend: B) -> Self {
        self.device = Device::Backend(Box::new(move |config, stores| {
            Context::from_backend_with_stores(backend, config, stores)
        }));
        self
    }

    /// Uses exactly `stores` as the persistent layer, looked up in order after the context's
    /// memory cache, instead of the stores the configuration names: for an embedder that keeps
    /// binaries in its own storage. `StoreChain::from_config(&config).with_store(mine)` keeps kpc's
    /// disk cache and read-only layers in front of the embedder's store (its hits are copied to the
    /// local disk); `StoreChain::new().with_store(mine)` uses the embedder's store alone.
    pub fn stores(mut self, stores: StoreChain) -> Self {
        self.stores = Some(stores);
        self
    }

    /// Subscribes `observer` to the context's cache events ([`CacheEvent`](crate::CacheEvent)):
    /// each level's hits and misses, waits for another builder, loads, refusals, builds and puts,
    /// and the kernels served by them, as they happen (see [`CacheObserver`]). May be called more than
    /// once; observers are told in the order they were added, after kpc's own.
    pub fn observer(mut self, observer: Arc<dyn CacheObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Sends the warnings about this context's caches and stores to `f` (instead of the
    /// process-wide callback, [`crate::set_warning_callback`], or stderr). Applies to the stores the
    /// configuration names; stores passed to [`ContextBuilder::stores`] keep the sink they were
    /// made with.
    pub fn on_warning(mut self, f: impl Fn(&Warning) + Send + Sync + 'static) -> Self {
        self.on_warning = Some(WarningCallback::new(f));
        self
    }

    /// Opens the context.
    ///
    /// Errors: [`crate::Error::Config`] for a malformed environment (without
    /// [`ContextBuilder::config`]); [`crate::Error::InvalidArgument`] for a selector that matches
    /// no device, or interop handles kpc cannot use (null, the wrong API version, a device not in
    /// the context), saying which; [`crate::Error::Unavailable`] when the device cannot be opened.
    pub fn build(self) -> Result<Context> {
        let mut config = match self.config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        if let Some(cb) = self.on_warning {
            config.on_warning = Some(cb);
        }
        let (chosen, observers) = (self.stores, self.observers);
        let stores = |config: &Config| {
            let chain = chosen.unwrap_or_else(|| StoreChain::from_config(config));
            observers.into_iter().fold(chain, StoreChain::with_observer)
        };
        let ctx = match self.device {
            Device::Select(selector) => {
                let device = super::device::select_device(&selector.unwrap_or(config.device))?;
                open(&device, &config, stores(&config))?
            }
            Device::Info(device) => open(&device, &config, stores(&config))?,
            Device::Vulkan(h) => {
                // SAFETY: the caller vouched for the handles in `vulkan_handles`, whose contract
                // is from_handles'.
                let b = unsafe { VulkanBackend::from_handles(&h, &config) }?;
                let s = stores(&config);
                Context::from_backend_with_stores(b, &config, s)
            }
            Device::OpenCl(h) => {
                // SAFETY: the caller vouched for the handles in `opencl_handles`, whose contract
                // is from_handles'.
                let b = unsafe { OpenClBackend::from_handles(&h, &config) }?;
                let s = stores(&config);
                Context::from_backend_with_stores(b, &config, s)
            }
            Device::Backend(make) => {
                let s = stores(&config);
                make(&config, s)
            }
        };
        Ok(ctx)
    }
}

/// Opens a device discovery reported.
fn open(device: &DeviceInfo, config: &Config, stores: StoreChain) -> Result<Context> {
    Ok(match device.backend {
        BackendKind::Vulkan => Context::from_backend_with_stores(
            VulkanBackend::open(device.index, config)?,
            config,
            stores,
        ),
        BackendKind::OpenCl => Context::from_backend_with_stores(
            OpenClBackend::open(device.index, config)?,
            config,
            stores,
        ),
    })
}
